"""The one writer of model folders: every converter that writes a folder (`upcycle`, `merge`, `export`,
`calibrate-aea`; the IC baseline of the experiments) calls `write_model_folder`, which writes each part a folder
may hold in one order and one form, each file once, and `moe_embed.folders.open_model_folder` is the one reader.

    weights and config.json   a transformers model's `save_pretrained` (or a config alone, for a graph folder),
                              `auto_map` already in the config
    code                      one generated file per entry point (`remote_code.write_folder_code`)
    tokenizer                 the source folder's tokenizer files, or a tokenizer object's files, in their final
                              form (a folder for clients that read them alone: padding, truncation, lengths)
    Sentence-Transformers     modules.json (the input module, then the source's modules or mean pooling),
                              sentence_bert_config.json, config_sentence_transformers.json with the prompts
    card                      README.md, by the caller's card function (each folder type has its template)

Each file is written once, in its final form: what a command wants in a file is an argument here, never a second
write after this one (`tests/test_folder_writer.py` audits every file each command opens for writing). The
prompts are derived from the tasks where the folder is made (`modeling.defaults.sentence_transformers_prompts`)
and written here once; `config.json` holds the tasks and prefixes the model routes by, as the model's config
saves them. The caller writes into a temporary folder (`moe_embed.files.atomic_output_dir`), so a failure leaves
no partial output.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from moe_embed.convert.checkpoint import copy_tokenizer_files
from moe_embed.convert.remote_code import folder_auto_map, write_folder_code
from moe_embed.files import read_json, write_json
from moe_embed.modeling.st_folder import write_model_config, write_module_config, write_modules

# tokenizer settings that describe one load (transformers adds them), not the folder
LOAD_TIME_SETTINGS = ("is_local", "local_files_only")
# transformers 5 saves a tokenizer of no model-specific class (ModernBERT's) as `TokenizersBackend`, a name 4.x and
# other readers of `tokenizer_config.json` do not know; `PreTrainedTokenizerFast` is the same class in every version
PORTABLE_TOKENIZER_CLASSES = {"TokenizersBackend": "PreTrainedTokenizerFast"}


def write_model_folder(
    target: Path,
    *,
    model=None,
    config: dict | None = None,
    max_shard_size: str | int = "2GB",
    code: str | None = None,
    tokenizer_from: Path | None = None,
    tokenizer=None,
    client_length: int | None = None,
    input_module: str,
    modules_from: Path | None = None,
    following_modules: list[dict] | None = None,
    module_settings: dict | None = None,
    carry_module_settings: bool = True,
    prompts: dict | None = None,
    default_prompt_name: str | None = None,
    card: Callable[[Path], None] | None = None,
) -> None:
    """Write a model folder into the existing folder `target`, each file once.

    Args:
        model: a transformers model, saved with `save_pretrained` (weights and `config.json`); or
        config: the `config.json` of a folder whose weights are written otherwise (an ONNX graph).
        code: a kind of `manifest.FOLDER_FILES` (a model type, or `aea`): its generated code files, and the
            `auto_map` pointing into them, put into the config before it is written.
        tokenizer_from: a folder whose tokenizer files are copied; or `tokenizer`, whose files are saved.
        client_length: for a folder whose clients read the tokenizer files alone (an ONNX folder): `tokenizer.json`
            pads to the longest row and truncates at this many tokens, `tokenizer_config.json` says the same
            (`model_max_length`, `max_length`: fastembed truncates at their minimum) and `special_tokens_map.json`
            is written (fastembed <= 0.8 requires it; transformers 5 no longer writes it).
        input_module: the Sentence-Transformers input module, `file.Class` at the folder root or
            sentence-transformers' own `Transformer`.
        modules_from: the folder whose modules after the input module (pooling, normalisation) and whose
            `sentence_bert_config.json` carry over (none: mean pooling), unless `following_modules` lists them.
        module_settings: entries for `sentence_bert_config.json`, over the carried-over ones (all of it when
            `carry_module_settings` is false).
        prompts, default_prompt_name: `config_sentence_transformers.json`'s.
        card: writes `README.md` into the folder it is given.
    """
    target = Path(target)
    if (model is None) == (config is None):
        raise ValueError("give the folder's model or its config, not both")
    if (tokenizer_from is None) == (tokenizer is None):
        raise ValueError("give the folder the tokenizer files come from or the tokenizer, not both")
    hidden_size = save_config(target, model, config, code, max_shard_size)
    if code is not None:
        write_folder_code(target, code)
    if tokenizer is not None:
        save_tokenizer(tokenizer, target, client_length)
    else:
        copy_tokenizer_files(tokenizer_from, target)
    if following_modules is None:
        write_modules(modules_from or target, target, input_module, hidden_size)
    else:
        write_json(target / "modules.json", following_modules_json(target, input_module, following_modules))
    write_module_config((modules_from or target) if carry_module_settings else None, target, module_settings)
    write_model_config(target, prompts or {}, default_prompt_name)
    if card is not None:
        card(target)


def save_config(target: Path, model, config: dict | None, code: str | None, max_shard_size) -> int:
    """Write the weights and `config.json` (with the `auto_map` of `code`'s files); returns the hidden size."""
    auto_map = folder_auto_map(code) if code is not None else None
    if model is not None:
        if auto_map:
            model.config.auto_map = auto_map  # what loading the folder gives the config anyway
        model.save_pretrained(target, max_shard_size=max_shard_size)
        return model.config.hidden_size
    write_json(target / "config.json", {**config, "auto_map": auto_map} if auto_map else config)
    return config["hidden_size"]


def save_tokenizer(tokenizer, target: Path, client_length: int | None = None) -> None:
    """The files of a transformers tokenizer, each written into `target` once in its final form: saved into a
    scratch folder first, then copied, or for `client_length` (see `write_model_folder`) rewritten on the way."""
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory(prefix="tokenizer-") as scratch:
        tokenizer.save_pretrained(scratch)
        saved = sorted(p for p in Path(scratch).iterdir() if p.is_file())
        for path in saved:
            if path.name == "tokenizer_config.json":
                settings = {k: v for k, v in read_json(path).items() if k not in LOAD_TIME_SETTINGS}
                if settings.get("tokenizer_class") in PORTABLE_TOKENIZER_CLASSES:
                    settings["tokenizer_class"] = PORTABLE_TOKENIZER_CLASSES[settings["tokenizer_class"]]
                if client_length is not None:
                    sides = {"padding_side": "right", "truncation_side": "right"}
                    settings.update(model_max_length=client_length, max_length=client_length, **sides)
                write_json(target / path.name, settings)
            elif path.name == "tokenizer.json" and client_length is not None:
                client = Tokenizer.from_file(str(path))
                client.enable_padding(direction="right", pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
                client.enable_truncation(client_length, direction="right")
                client.save(str(target / path.name))
            else:
                shutil.copyfile(path, target / path.name)
    if client_length is not None and "special_tokens_map.json" not in {p.name for p in saved}:
        write_json(target / "special_tokens_map.json", dict(tokenizer.special_tokens_map))


def following_modules_json(target: Path, input_module: str, following: list[dict]) -> list[dict]:
    """`modules.json` of the input module then `following` (`{"path": ..., "type": ...}`), each path created."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": input_module}]
    for entry in following:
        (target / entry["path"]).mkdir(parents=True, exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)), **entry})
    return modules


__all__ = ["write_model_folder", "save_tokenizer"]
