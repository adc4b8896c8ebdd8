"""The options of the converters (`moe-embed upcycle`, `merge`, `export`, `calibrate-aea`): one dataclass per
command, each field a command-line option by its Python name, checked on construction (a bad value is a
`UsageError` before any model is loaded). The command files (`upcycle.py`, ...) parse the command line into
them and call the function that takes them; the workers that write folders (`builders.py`, `merging.py`,
`onnx_folder.py`, `aea_calibration.py`) read them. This module imports no model code, so that `--help` and
bad arguments answer before torch is imported.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path

from moe_embed.convert.task_prefixes import parse_task_prefixes
from moe_embed.modeling.defaults import AEA_EMBEDDINGS, AEA_ROUNDINGS, COMOE, DEFAULT_TASK, DEFAULT_TASK_PREFIXES, MOE
from moe_embed.usage import UsageError

ARCHES = ("mote", "moe", "comoe")
DEFAULT_OUTPUTS = {"mote": "models/mote-minilm", "moe": "models/moe-minilm", "comoe": "models/comoe-minilm"}
DTYPES = ("float32", "float16", "bfloat16")
# options shared by moe and comoe whose defaults differ between them (the papers' settings): None means "the
# default of --arch"
SHARED_DEFAULTS = {
    "num_experts": {"moe": MOE.num_local_experts, "comoe": COMOE.num_local_experts},
    "experts_per_token": {"moe": MOE.num_experts_per_tok, "comoe": COMOE.num_experts_per_tok},
    "router_aux_loss_coef": {"moe": MOE.router_aux_loss_coef, "comoe": COMOE.router_aux_loss_coef},
}


def _arch(*arches: str, **kwargs):
    """A field that applies to `arches` only (another --arch refuses it when it differs from its default)."""
    metadata = {"arches": arches}
    if "default_factory" in kwargs:
        return field(default_factory=kwargs["default_factory"], metadata=metadata)
    return field(default=kwargs.get("default"), metadata=metadata)


@dataclass
class UpcycleOptions:
    """What `upcycle` writes: the command line's options, by their Python names (`moe-embed upcycle --help`
    says what each does). Checked on construction: a bad value, or an option of another `arch` changed from
    its default, is a `UsageError`."""

    output: str | Path | None = None  # default: DEFAULT_OUTPUTS[arch]
    arch: str = "mote"
    base: str | None = None  # a local folder or Hub id; None: the bundled all-MiniLM-L6-v2
    overwrite: bool = False
    tasks: list[str] | dict[str, str] = field(default_factory=lambda: dict(DEFAULT_TASK_PREFIXES))
    # mote
    expert_layers: str | list[int] = _arch("mote", default="every_other")
    default_task: str | None = _arch("mote", default=None)
    prefix_routes_only: bool = _arch("mote", default=False)
    strict_routing: bool = _arch("mote", default=False)
    # moe and comoe
    num_experts: int | None = _arch("moe", "comoe", default=None)
    experts_per_token: int | None = _arch("moe", "comoe", default=None)
    router_aux_loss_coef: float | None = _arch("moe", "comoe", default=None)
    seed: int = _arch("moe", "comoe", default=0)
    # moe
    moe_layers: str | list[int] = _arch("moe", default=MOE.moe_layers)
    norm_topk_prob: bool = _arch("moe", default=False)
    router_init: str = _arch("moe", default="normal")
    expert_noise: float = _arch("moe", default=0.0)
    router_z_loss_coef: float = _arch("moe", default=MOE.router_z_loss_coef)
    router_jitter_noise: float = _arch("moe", default=MOE.router_jitter_noise)
    # comoe
    rank: int = _arch("comoe", default=COMOE.lora_rank)
    lora_alpha: float = _arch("comoe", default=COMOE.lora_alpha)
    lora_dropout: float = _arch("comoe", default=COMOE.lora_dropout)
    target_modules: str | list[str] = _arch("comoe", default=COMOE.target_modules)
    layers: str | list[int] = _arch("comoe", default=COMOE.adapter_layers)
    contrastive_loss_coef: float = _arch("comoe", default=COMOE.contrastive_loss_coef)
    contrastive_tau: float = _arch("comoe", default=COMOE.contrastive_tau)
    # the written folder
    dtype: str = "float32"
    max_shard_size: str = "2GB"
    repo_id: str | None = None
    no_verify: bool = False

    def __post_init__(self):
        if self.arch not in ARCHES:
            raise UsageError(f"unknown arch {self.arch!r}; expected one of {', '.join(ARCHES)}")
        given = [f for f in fields(self) if "arches" in f.metadata and self.arch not in f.metadata["arches"]]
        given = [f for f in given if getattr(self, f.name) != f.default]
        if given:
            names = ", ".join(f"--{f.name.replace('_', '-')}" for f in given)
            arches = sorted({a for f in given for a in f.metadata["arches"]})
            raise UsageError(f"{names} only apply to --arch {'/'.join(arches)} (this run is --arch {self.arch})")
        self.tasks = parse_task_prefixes(self.tasks)
        if self.strict_routing and self.default_task is not None:
            raise UsageError("pass --default-task or --strict-routing, not both")
        if self.expert_noise < 0:
            raise UsageError(f"--expert-noise must be >= 0, got {self.expert_noise}")
        if self.router_init not in ("normal", "zeros"):
            raise UsageError(f"--router-init must be normal or zeros, got {self.router_init!r}")
        if self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")
        self.output = Path(self.output or DEFAULT_OUTPUTS[self.arch])

    @classmethod
    def from_mapping(cls, values: dict, where: str = "upcycle") -> UpcycleOptions:
        """Options from a mapping (a training config's `upcycle:` section): an unknown key is a `UsageError`
        naming the closest valid one."""
        known = [f.name for f in fields(cls)]
        for key in values:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                raise UsageError(f"unknown key {key!r} in {where}{hint} Valid keys: {', '.join(known)}")
        return cls(**values)

    def shared(self, option: str):
        """A moe / comoe option as given, else the default of `arch`."""
        value = getattr(self, option)
        return SHARED_DEFAULTS[option][self.arch] if value is None else value

    @property
    def mote_default_task(self) -> str | None:
        """The task of inputs that name none: `--default-task`, else the paper's expert for generic
        similarity where it is a task, else none (they are an error)."""
        if self.strict_routing:
            return None
        if self.default_task is not None:
            return self.default_task
        return DEFAULT_TASK if DEFAULT_TASK in self.tasks else None


@dataclass
class MergeOptions:
    """What `merge` writes: the command line's options by their Python names (`moe-embed merge --help`)."""

    model_dir: str | Path
    output: str | Path
    overwrite: bool = False
    task: str | None = None  # MoTE: one task's experts, unchanged
    experts: str | list[str] | None = None  # MoTE task names or MoE expert indices to average
    weights: str | list[float] | None = None  # one per averaged expert, normalised
    calibration: str | Path | None = None  # MoE / CoMoE: texts, one per line, to weight experts by routing
    dtype: str | None = None  # default: that of the input
    max_shard_size: str = "2GB"
    repo_id: str | None = None

    def __post_init__(self):
        if self.task and self.experts:
            raise UsageError("pass --task or --experts, not both")
        if self.calibration and self.weights:
            raise UsageError("pass --calibration or --weights, not both")
        if isinstance(self.experts, str):
            self.experts = [name.strip() for name in self.experts.split(",") if name.strip()]
        if isinstance(self.weights, str):
            try:
                self.weights = [float(w) for w in self.weights.split(",")]
            except ValueError:
                raise UsageError(f"--weights expects comma-separated numbers, got {self.weights!r}") from None
        if self.dtype is not None and self.dtype not in DTYPES:
            raise UsageError(f"unknown dtype {self.dtype!r}; expected one of {', '.join(DTYPES)}")

    @property
    def selected(self) -> list[str] | None:
        """The experts `task` / `experts` name, or `None` for all."""
        return [self.task] if self.task else (list(self.experts) if self.experts else None)


# Refuse an int8 graph when a row's cosine to fp32 is below this: between the agreement measured to keep
# accuracy and the one measured to break it (docs/benchmarks.md, "Serving", says which runs set it).
DEFAULT_MIN_COSINE = 0.97


@dataclass
class ExportOptions:
    """What `export_onnx` writes: the command line's options by their Python names (`moe-embed export
    --help`). Checked on construction, before any model is loaded."""

    model_dir: str | Path
    output: str | Path
    overwrite: bool = False
    task: str | None = None  # MoTE: only this task's experts, as a plain graph
    task_ids_input: bool = False  # MoTE: a `task_ids` input besides the prompt
    quantize: str | None = None  # "int8": also the int8 graph
    int8_min_cosine: float = DEFAULT_MIN_COSINE
    opset: int | None = None
    tolerance: float = 1e-4

    def __post_init__(self):
        if self.quantize not in (None, "int8"):
            raise UsageError(f"--quantize takes int8, got {self.quantize!r}")
        if self.task_ids_input and self.task:
            raise UsageError("--task-ids-input applies to routed MoTE graphs (a MoTE folder without --task)")
        if self.opset is not None and not 18 <= self.opset <= 23:
            raise UsageError(f"--opset must lie in 18..23 (the dynamo exporter's range), got {self.opset}")
        if not 0 < self.int8_min_cosine <= 1:
            raise UsageError(f"--int8-min-cosine must lie in (0, 1], got {self.int8_min_cosine}")


ALLOCATIONS = ("both", "layer", "token", "none")
DEFAULT_ALPHAS = "0,1,2,3,4,5,6,7,8,9,10"


def parse_values(text: str | list, kind, option: str) -> list:
    """Comma-separated numbers of `option` (a list is checked as it is)."""
    try:
        values = [kind(item) for item in (text.split(",") if isinstance(text, str) else text) if str(item).strip()]
    except ValueError:
        raise UsageError(f"{option} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise UsageError(f"{option} is empty")
    return values


@dataclass
class CalibrateOptions:
    """What `calibrate` writes: the command line's options by their Python names (`moe-embed calibrate-aea
    --help`). Checked on construction, before any model is loaded."""

    model: str
    output: str | Path
    overwrite: bool = False
    calibration: str | Path | None = None  # texts, one per line; default: the STS-B dev sentences
    allocation: str = "both"
    alpha: float = 1.0
    shift: float = 1.0
    exit_layer: int | None = None
    rounding: str = "floor"
    embedding: str = "hidden"
    prompt: str | None = None  # a template with [TEXT]
    pooling: str | None = None
    search: bool = False
    alphas: str | list[float] = DEFAULT_ALPHAS
    exit_layers: str | list[int] | None = None
    data_dir: str | None = None
    batch_size: int = 64
    max_length: int = 256

    def __post_init__(self):
        if self.allocation not in ALLOCATIONS:
            raise UsageError(f"--allocation must be one of {', '.join(ALLOCATIONS)}, got {self.allocation!r}")
        if self.alpha < 0:
            raise UsageError(f"--alpha must be >= 0, got {self.alpha}")
        if self.embedding not in AEA_EMBEDDINGS:
            raise UsageError(f"--embedding must be one of {', '.join(AEA_EMBEDDINGS)}")
        if self.rounding not in AEA_ROUNDINGS:
            raise UsageError(f"--rounding must be one of {', '.join(AEA_ROUNDINGS)}")
        if self.pooling not in (None, "last", "mean"):
            raise UsageError(f"--pooling must be last or mean, got {self.pooling!r}")
        if self.prompt is not None and "[TEXT]" not in self.prompt:
            raise UsageError(f"--prompt must contain [TEXT] where the text goes, got {self.prompt!r}")
        self.alphas = parse_values(self.alphas, float, "--alphas")
        if self.exit_layers is not None:
            self.exit_layers = parse_values(self.exit_layers, int, "--exit-layers")
        if self.batch_size < 1 or self.max_length < 1:
            raise UsageError("--batch-size and --max-length must be positive integers")
