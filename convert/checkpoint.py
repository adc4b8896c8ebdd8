"""What every converter shares: reading dense checkpoints (safetensors only), mapping state dicts with every
key and shape checked, and the tokenizer and code files of a model folder. Bad input raises `UsageError`
(one line on stderr, exit code 2)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from moe_embed.convert.bases import base_of, encoder_fields
from moe_embed.errors import UsageError
from moe_embed.files import read_json
from moe_embed.folders import check_config_shape
from moe_embed.modeling.manifest import TOKENIZER_FILES

logger = logging.getLogger(__name__)


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


@dataclass
class DenseCheckpoint:
    """A dense checkpoint as upcycling reads it: its transformers config (the base's own config class, which also
    reads the older forms of its fields), the encoder fields it gives, and its weights under the shared encoder's
    names (`convert/bases.py`)."""

    config: object
    fields: dict
    state: dict[str, torch.Tensor]


def read_dense_checkpoint(folder: Path) -> DenseCheckpoint:
    """The dense checkpoint in `folder`: config, encoder fields and encoder state dict (heads dropped).

    Raises:
        UsageError: for a model type this package does not upcycle (naming those it does), a config transformers
            cannot read, weights that are not safetensors or hold no encoder layers.
    """
    from transformers import AutoConfig

    where = Path(folder) / "config.json"
    raw = check_config_shape(read_json(where), where)
    base = base_of(raw.get("model_type"), str(where))
    try:
        config = AutoConfig.from_pretrained(str(folder))
    except (ValueError, TypeError) as error:
        raise UsageError(f"cannot read {where}: {str(error).splitlines()[0]}") from None
    state = base.to_ours(read_state_dict(folder))
    if not any(key.startswith("encoder.layer.") for key in state):
        raise UsageError(f"{folder} holds no encoder layers; is it a {base.name} encoder?")
    fields = {**encoder_fields(config), "add_pooling_layer": "pooler.dense.weight" in state}
    return DenseCheckpoint(config, fields, state)


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


def parse_dtype(name: str) -> torch.dtype:
    """`float32`/`float16`/`bfloat16` to a torch dtype."""
    dtypes = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise UsageError(f"unknown dtype {name!r}; expected one of {', '.join(dtypes)}")
    return dtypes[name]
