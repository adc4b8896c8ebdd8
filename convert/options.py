"""The options of the converters (`moe-embed upcycle`, `merge`, `export`, `calibrate-aea`): one dataclass per
command, each field a command-line option by its Python name, checked on construction (a bad value is a
`UsageError` before any model is loaded). The command files (`upcycle.py`, ...) parse the command line into
them and call the function that takes them; the workers that write folders (`builders.py`, `merging.py`,
`onnx_folder.py`, `aea_calibration.py`) read them. This module imports no model code, so that `--help` and
bad arguments answer before torch is imported.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields, make_dataclass
from pathlib import Path

from moe_embed.convert.task_prefixes import parse_task_prefixes
from moe_embed.data import DATA_DIR_HELP
from moe_embed.modeling.defaults import AEA_EMBEDDINGS, AEA_ROUNDINGS, COMOE, DEFAULT_TASK, DEFAULT_TASK_PREFIXES, MOE
from moe_embed.usage import UsageError, option, shard_size

ARCHES = ("mote", "moe", "comoe")
DEFAULT_OUTPUTS = {"mote": "models/mote-minilm", "moe": "models/moe-minilm", "comoe": "models/comoe-minilm"}
DTYPES = ("float32", "float16", "bfloat16")
# options shared by moe and comoe whose defaults differ between them (the papers' settings): None means "the
# default of --arch"
SHARED_DEFAULTS = {
    "num_local_experts": {"moe": MOE.num_local_experts, "comoe": COMOE.num_local_experts},
    "num_experts_per_tok": {"moe": MOE.num_experts_per_tok, "comoe": COMOE.num_experts_per_tok},
    "router_aux_loss_coef": {"moe": MOE.router_aux_loss_coef, "comoe": COMOE.router_aux_loss_coef},
}


def _arch(*arches: str, default=None, **kwargs):
    """An option that applies to `arches` only (another --arch refuses it when it differs from its default), shown
    in their group of `--help`."""
    return option(default, arches=arches, group=" and ".join(arches), **kwargs)


def _shared_help(text: str, name: str) -> str:
    return f"{text} (default: {', '.join(f'{value} for {arch}' for arch, value in SHARED_DEFAULTS[name].items())})"


@dataclass
class UpcycleOptions:
    """What `upcycle` writes: the command line's options by their Python names; `--help` is generated from the
    fields (`moe_embed.usage.options_parser`). Checked on construction: a bad value, or an option of another
    `arch` changed from its default, is a `UsageError`."""

    arch: str = option(
        "mote",
        choices=ARCHES,
        help="mote: one expert per task, routed per sequence by the instruction; "
        "moe: token-routed top-k experts (Nomic Embed v2); "
        "comoe: top-k routed LoRA experts on a frozen encoder (CoMoE-PEFT)",
    )
    base: str | None = option(
        help="local folder or Hub id of the dense checkpoint (default: the bundled all-MiniLM-L6-v2)"
    )
    output: str | Path | None = option(
        help=f"folder to write (default: {', '.join(f'{v} for {k}' for k, v in DEFAULT_OUTPUTS.items())})"
    )
    overwrite: bool = option(False, help="replace --output if it exists")
    tasks: list[str] | dict[str, str] = option(
        default_factory=lambda: dict(DEFAULT_TASK_PREFIXES),
        nargs="+",
        metavar="NAME=PREFIX",
        help="tasks, each NAME=PREFIX (or a known NAME alone): MoTE's experts in order; "
        "for every architecture the Sentence-Transformers prompts",
    )
    expert_layers: str | list[int] = _arch(
        "mote",
        default="every_other",
        help="layers that get task experts: all, every_other (1,3,5,...) or comma-separated indices",
    )
    default_task: str | None = _arch(
        "mote",
        help=f"task of inputs that name none and carry no prefix, so that a plain encode(texts) works "
        f"(default: {DEFAULT_TASK} where it is a task, the MoTE paper's expert for STS)",
    )
    prefix_routes_only: bool = _arch(
        "mote",
        default=False,
        help="the task prefix (a prompt, or at the start of a text) only picks the expert: the encoder reads the "
        "text without it, so the untrained model embeds plain text as the dense model does; without it the "
        "prefix is also read, the paper's choice",
    )
    strict_routing: bool = _arch(
        "mote", default=False, help="no default task: inputs that name no task and carry no prefix are an error"
    )
    num_local_experts: int | None = _arch(
        "moe",
        "comoe",
        renamed_from="num_experts",
        help=_shared_help("experts per MoE layer / per CoMoE linear", "num_local_experts"),
    )
    num_experts_per_tok: int | None = _arch(
        "moe",
        "comoe",
        renamed_from="experts_per_token",
        help=_shared_help("experts each token is routed to, top-k", "num_experts_per_tok"),
    )
    router_aux_loss_coef: float | None = _arch(
        "moe", "comoe", help=_shared_help("load-balancing loss weight", "router_aux_loss_coef")
    )
    seed: int = _arch("moe", "comoe", default=0, help="seed of the router and LoRA init and expert noise")
    moe_layers: str | list[int] = _arch(
        "moe",
        default=MOE.moe_layers,
        help="layers whose FFN becomes an MoE block: every_other (1,3,5,...), all, or indices",
    )
    norm_topk_prob: bool = _arch(
        "moe",
        default=False,
        help="renormalise the top-k router weights to sum to 1 (then the upcycled model equals the dense one)",
    )
    router_init: str = _arch(
        "moe",
        default="normal",
        choices=("normal", "zeros"),
        help="router weights: normal(0, initializer_range) or zeros (uniform routing)",
    )
    expert_noise: float = _arch(
        "moe", default=0.0, help="std of Gaussian noise added to each expert's weights to break symmetry"
    )
    router_z_loss_coef: float = _arch("moe", default=MOE.router_z_loss_coef, help="router z-loss weight")
    router_jitter_noise: float = _arch("moe", default=MOE.router_jitter_noise, help="router input jitter in training")
    lora_rank: int = _arch("comoe", default=COMOE.lora_rank, renamed_from="rank", help="LoRA rank r of every expert")
    lora_alpha: float = _arch("comoe", default=COMOE.lora_alpha, help="LoRA alpha (experts are scaled by alpha / r)")
    lora_dropout: float = _arch("comoe", default=COMOE.lora_dropout, help="dropout on the experts' input in training")
    target_modules: str | list[str] = _arch(
        "comoe",
        default=COMOE.target_modules,
        help="linears that get experts, matched as peft's target_modules "
        "(query, key, value, attention.output.dense, intermediate.dense, output.dense)",
    )
    adapter_layers: str | list[int] = _arch(
        "comoe",
        default=COMOE.adapter_layers,
        renamed_from="layers",
        help="layers whose target linears get experts: all, every_other or indices",
    )
    contrastive_loss_coef: float = _arch(
        "comoe", default=COMOE.contrastive_loss_coef, help="weight λ of the contrastive expert loss (0: MoE-LoRA)"
    )
    contrastive_tau: float = _arch(
        "comoe", default=COMOE.contrastive_tau, help="temperature of the contrastive expert loss"
    )
    dtype: str = option("float32", choices=DTYPES, help="dtype of the saved weights")
    max_shard_size: str = option("2GB", type=shard_size, help="safetensors shard size above which weights are split")
    repo_id: str | None = option(help="Hub id shown in the model card's usage snippets")
    no_verify: bool = option(False, help="skip the check that the upcycled model reproduces the dense model")

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


def arch_options(arch: str, *, name: str, module: str, doc: str, exclude: tuple = (), post_init=None) -> type:
    """A dataclass of the `UpcycleOptions` fields that apply to `arch`, the same names, types, help and defaults
    (an option shared with another arch gets `arch`'s default), for another reader of the same options: training's
    `adapter:` section is `arch_options("comoe", ...)`, so each CoMoE hyper-parameter is declared once, here."""
    hints = typing.get_type_hints(UpcycleOptions)
    specs = []
    for spec in fields(UpcycleOptions):
        if arch not in spec.metadata.get("arches", ()) or spec.name in exclude:
            continue
        metadata = {key: value for key, value in spec.metadata.items() if key not in ("arches", "group")}
        default = spec.default
        if spec.name in SHARED_DEFAULTS:
            default = SHARED_DEFAULTS[spec.name][arch]
            metadata["help"] = metadata["help"].split(" (default:")[0]  # `_shared_help`'s per-arch defaults, gone
        specs.append((spec.name, hints[spec.name], field(default=default, metadata=metadata)))
    namespace = {"__post_init__": post_init} if post_init else {}
    options = make_dataclass(name, specs, namespace=namespace)
    options.__doc__, options.__module__, options.__qualname__ = doc, module, name  # importable by name: picklable
    return options


@dataclass
class FolderOptions:
    """What every converter from a folder to a folder takes: the folder it reads, the one it writes, and whether
    an existing output may be replaced."""

    model_dir: str | Path = option(required=True, positional=True, help="the model folder to read")
    output: str | Path = option(required=True, help="folder to write")
    overwrite: bool = option(False, help="replace --output if it exists")


@dataclass
class MergeOptions(FolderOptions):
    """What `merge` writes: the command line's options by their Python names (`moe-embed merge --help`)."""

    model_dir: str | Path = option(
        required=True,
        positional=True,
        help="MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder",
    )
    task: str | None = option(help="MoTE: export this task's experts (only its prompts are kept)")
    experts: str | list[str] | None = option(
        help="average only these experts: MoTE task names (e.g. clustering,document) or MoE indices (e.g. 0,3)"
    )
    weights: str | list[float] | None = option(help="comma-separated weights of the averaged experts (normalised)")
    calibration: str | Path | None = option(
        help="MoE / CoMoE: text file, one text per line; weight each layer's experts by their router usage on it"
    )
    dtype: str | None = option(choices=DTYPES, help="dtype of the saved weights (default: that of the input)")
    max_shard_size: str = option("2GB", type=shard_size, help="safetensors shard size above which weights are split")
    repo_id: str | None = option(help="Hub id shown in the model card's usage snippets")

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
class ExportOptions(FolderOptions):
    """What `export_onnx` writes (onnx/model.onnx, the tokenizer, configs, README): the command line's options by
    their Python names (`moe-embed export --help`). Checked on construction, before any model is loaded."""

    model_dir: str | Path = option(
        required=True,
        positional=True,
        help="MoTE, token-routed MoE, CoMoE or dense (bert, roberta, xlm-roberta) folder",
    )
    task: str | None = option(help="MoTE: export only this task's experts, as a plain graph")
    task_ids_input: bool = option(False, help="MoTE: add a task_ids input (-1: the prompt decides)")
    quantize: str | None = option(
        choices=["int8"],
        help="also write onnx/model_qint8_avx512_vnni.onnx (onnxruntime) and, with the openvino extra, "
        "openvino/openvino_model_qint8_quantized.xml (NNCF static int8)",
    )
    int8_min_cosine: float = option(
        DEFAULT_MIN_COSINE,
        help="refuse the int8 graph when a row's cosine to fp32 is below this (default: %(default)s)",
    )
    opset: int | None = option(help="ONNX opset, 18..23 (default: the exporter's)")
    tolerance: float = option(1e-4, help="largest |onnxruntime - torch| accepted (default: 1e-4)")

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

    model: str = option(required=True, positional=True, help="a supported MoE model: local folder or Hub id")
    output: str | Path = option(required=True, help="folder to write (refused if it exists, unless --overwrite)")
    overwrite: bool = option(False, help="replace an existing --output folder")
    calibration: str | Path | None = option(help="text file, one text per line (default: the STS-B dev sentences)")
    allocation: str = option(
        "both",
        choices=ALLOCATIONS,
        help="both: layer- and token-wise (AEA); layer / token: one of them; none: the unmodified model with "
        "the same prompt, pooling and exit layer (the baseline)",
    )
    alpha: float = option(1.0, help="scaling α of (shift - s_l)^α (default 1)")
    shift: float = option(1.0, help="c in (c - s_l)^α: 1 is the paper's rule, 0.1 its Qwen variant")
    exit_layer: int | None = option(
        help="number of layers whose output is embedded, 1..L (default L-1 for decoders, L for encoders)"
    )
    rounding: str = option(
        "floor",
        choices=AEA_ROUNDINGS,
        help="per-token counts: the paper's floor, or largest remainder (spends each layer's budget exactly)",
    )
    embedding: str = option(
        "hidden",
        choices=AEA_EMBEDDINGS,
        help="hidden: the pooled hidden state; moee-concat / moee-sum: MoEE with the routing weights",
    )
    prompt: str | None = option(help="template with [TEXT] (default PromptEOL for decoders, the text for encoders)")
    pooling: str | None = option(choices=("last", "mean"), help="default last for decoders, mean for encoders")
    search: bool = option(False, help="choose --alpha and --exit-layer on the STS-B dev pairs")
    alphas: str | list[float] = option(DEFAULT_ALPHAS, help=f"--search grid of α (default {DEFAULT_ALPHAS})")
    exit_layers: str | list[int] | None = option(help="--search grid of exit layers (default the last four)")
    data_dir: str | None = option(help=DATA_DIR_HELP)
    batch_size: int = option(64, help="texts per forward pass")
    max_length: int = option(256, help="truncate texts to this many tokens")

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
