"""The options of the converters (`moe-embed upcycle`, `merge`, `export`, `calibrate-aea`): one dataclass per
command (upcycle: one per architecture), each field a command-line option by its Python name, checked on
construction (a bad value is a `UsageError` before any model is loaded). The command files (`upcycle.py`, ...)
parse the command line into them and call the function that takes them; the workers that write folders
(`builders.py`, `merging.py`, `onnx_folder.py`, `aea_calibration.py`) read them. This module imports no model code,
so that `--help` and bad arguments answer before torch is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import ClassVar, Literal

from moe_embed.convert.onnx_int8 import INT8_VARIANTS
from moe_embed.convert.task_prefixes import parse_task_prefixes
from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import UsageError
from moe_embed.modeling.defaults import (
    AEA_EMBEDDINGS,
    AEA_ROUNDINGS,
    COMOE,
    DEFAULT_TASK,
    DEFAULT_TASK_PREFIXES,
    MOE,
    TASK_NAME_ALIASES,
    TASK_TYPE_EXPERTS,
)
from moe_embed.options import (
    ArgumentParser,
    add_options,
    check_choices,
    command_parser,
    option,
    parse,
    renamed_fields,
    renamed_message,
    shard_size,
)

Dtype = Literal["float32", "float16", "bfloat16"]


@dataclass(kw_only=True)
class UpcycleOptions:
    """What `upcycle` writes, whatever the architecture: the options every architecture shares, by their
    command-line names. Each architecture's options are a subclass with its own typed defaults (as peft has a
    config class per method): `MoteOptions`, `MoeOptions`, `CoMoeOptions`; `upcycle_options(arch, ...)` picks
    one by name, as `moe-embed upcycle --arch` does. Checked on construction: a bad value is a `UsageError`; a
    former option name (`num_experts`) is a `TypeError` naming the new one."""

    arch: ClassVar[str]
    summary: ClassVar[str]

    base: str | None = option(
        help="local folder or Hub id of the dense checkpoint (default: the bundled all-MiniLM-L6-v2)"
    )
    output: str | Path | None = option(help="folder to write (default: models/<arch>-minilm)")
    overwrite: bool = option(False, help="replace --output if it exists")
    tasks: list[str] | dict[str, str] = option(
        default_factory=lambda: dict(DEFAULT_TASK_PREFIXES),
        nargs="+",
        metavar="NAME=PREFIX",
        help="tasks, each NAME=PREFIX (or a known NAME alone): MoTE's experts in order; "
        "for every architecture the Sentence-Transformers prompts",
    )
    dtype: Dtype = option("float32", help="dtype of the saved weights")
    max_shard_size: str = option("2GB", type=shard_size, help="safetensors shard size above which weights are split")
    repo_id: str | None = option(help="Hub id shown in the model card's usage snippets")
    verify: bool = option(True, help="check that the upcycled model reproduces the dense model")

    def __new__(cls, *args, **kwargs):
        renamed = {
            old: new for options in (cls, *ARCH_OPTIONS.values()) for old, new in renamed_fields(options).items()
        }
        for key in kwargs:
            if key in renamed:
                raise TypeError(f"{cls.__name__}: {renamed_message(key, renamed[key])}")
        if not hasattr(cls, "arch"):
            raise TypeError(
                "UpcycleOptions holds what every arch shares: build MoteOptions, MoeOptions or CoMoeOptions, "
                "or upcycle_options(arch, ...)"
            )
        return super().__new__(cls)

    def __post_init__(self):
        check_choices(self)
        self.tasks = parse_task_prefixes(self.tasks)

    @property
    def output_path(self) -> Path:
        """The folder to write: `output`, else `models/<arch>-minilm`."""
        return Path(self.output or f"models/{self.arch}-minilm")


@dataclass(kw_only=True)
class MoteOptions(UpcycleOptions):
    """`upcycle --arch mote`: one expert per task, routed per sequence by the instruction (MoTE)."""

    arch: ClassVar[str] = "mote"
    summary: ClassVar[str] = "one expert per task, routed per sequence by the instruction"

    expert_layers: str | list[int] = option(
        "every_other", help="layers that get task experts: all, every_other (1,3,5,...) or comma-separated indices"
    )
    default_task: str | None = option(
        help=f"task of inputs that name none and carry no prefix, so that a plain encode(texts) works "
        f"(default: {DEFAULT_TASK} where it is a task, the MoTE paper's expert for STS)",
    )
    prefix_routes_only: bool = option(
        False,
        help="the task prefix (a prompt, or at the start of a text) only picks the expert: the encoder reads the "
        "text without it, so the untrained model embeds plain text as the dense model does; without it the "
        "prefix is also read, the paper's choice",
    )
    strict_routing: bool = option(
        False, help="no default task: inputs that name no task and carry no prefix are an error"
    )

    def __post_init__(self):
        super().__post_init__()
        if self.strict_routing and self.default_task is not None:
            raise UsageError("pass --default-task or --strict-routing, not both")
        if self.default_task is not None:
            self.default_task = self._task(self.default_task)

    def _task(self, name: str) -> str:
        """The task `name` is or stands for (an alias such as `passage` or a task type such as `sts`), checked
        here so that a wrong `--default-task` is refused before the model is read."""
        aliases = {**TASK_NAME_ALIASES, **TASK_TYPE_EXPERTS}
        if name in self.tasks:
            return name
        if aliases.get(name) in self.tasks:
            return aliases[name]
        known = [alias for alias, task in aliases.items() if task in self.tasks and alias not in self.tasks]
        raise UsageError(f"Unknown task {name!r}; expected one of {', '.join(self.tasks)} (or {', '.join(known)})")

    @property
    def mote_default_task(self) -> str | None:
        """The task of inputs that name none: `--default-task`, else the paper's expert for generic
        similarity where it is a task, else none (they are an error)."""
        if self.strict_routing:
            return None
        if self.default_task is not None:
            return self.default_task
        return DEFAULT_TASK if DEFAULT_TASK in self.tasks else None


@dataclass(kw_only=True)
class RoutedOptions(UpcycleOptions):
    """What the top-k routed architectures (`MoeOptions`, `CoMoeOptions`) share beyond every arch's options."""

    seed: int = option(0, help="seed of the router and LoRA init and expert noise")


@dataclass(kw_only=True)
class MoeOptions(RoutedOptions):
    """`upcycle --arch moe`: token-routed top-k experts, each a copy of the dense FFN (Nomic Embed v2)."""

    arch: ClassVar[str] = "moe"
    summary: ClassVar[str] = "token-routed top-k experts (Nomic Embed v2)"

    num_local_experts: int = option(MOE.num_local_experts, renamed_from="num_experts", help="experts per MoE layer")
    num_experts_per_tok: int = option(
        MOE.num_experts_per_tok, renamed_from="experts_per_token", help="experts each token is routed to, top-k"
    )
    router_aux_loss_coef: float = option(MOE.router_aux_loss_coef, help="load-balancing loss weight")
    moe_layers: str | list[int] = option(
        MOE.moe_layers, help="layers whose FFN becomes an MoE block: every_other (1,3,5,...), all, or indices"
    )
    norm_topk_prob: bool = option(
        False, help="renormalise the top-k router weights to sum to 1 (then the upcycled model equals the dense one)"
    )
    router_init: Literal["normal", "zeros"] = option(
        "normal", help="router weights: normal(0, initializer_range) or zeros (uniform routing)"
    )
    expert_noise: float = option(0.0, help="std of Gaussian noise added to each expert's weights to break symmetry")
    router_z_loss_coef: float = option(MOE.router_z_loss_coef, help="router z-loss weight")
    router_jitter_noise: float = option(MOE.router_jitter_noise, help="router input jitter in training")

    def __post_init__(self):
        super().__post_init__()
        if self.expert_noise < 0:
            raise UsageError(f"--expert-noise must be >= 0, got {self.expert_noise}")


@dataclass(kw_only=True)
class CoMoeOptions(RoutedOptions):
    """`upcycle --arch comoe`: top-k routed LoRA experts on a frozen encoder (CoMoE-PEFT). Also training's
    `adapter:` section (`arch: comoe` and `arch: lora`, which reads the LoRA fields)."""

    arch: ClassVar[str] = "comoe"
    summary: ClassVar[str] = "top-k routed LoRA experts on a frozen encoder (CoMoE-PEFT)"

    num_local_experts: int = option(
        COMOE.num_local_experts, renamed_from="num_experts", help="LoRA experts per adapted linear"
    )
    num_experts_per_tok: int = option(
        COMOE.num_experts_per_tok, renamed_from="experts_per_token", help="experts each token is routed to, top-k"
    )
    router_aux_loss_coef: float = option(COMOE.router_aux_loss_coef, help="load-balancing loss weight")
    lora_rank: int = option(COMOE.lora_rank, renamed_from="rank", help="LoRA rank r of every expert")
    lora_alpha: float = option(COMOE.lora_alpha, help="LoRA alpha (experts are scaled by alpha / r)")
    lora_dropout: float = option(COMOE.lora_dropout, help="dropout on the experts' input in training")
    target_modules: str | list[str] = option(
        COMOE.target_modules,
        help="linears that get experts, matched as peft's target_modules "
        "(query, key, value, attention.output.dense, intermediate.dense, output.dense)",
    )
    adapter_layers: str | list[int] = option(
        COMOE.adapter_layers,
        renamed_from="layers",
        help="layers whose target linears get experts: all, every_other or indices",
    )
    contrastive_loss_coef: float = option(
        COMOE.contrastive_loss_coef, help="weight λ of the contrastive expert loss (0: MoE-LoRA)"
    )
    contrastive_tau: float = option(COMOE.contrastive_tau, help="temperature of the contrastive expert loss")


ARCH_OPTIONS: dict[str, type[UpcycleOptions]] = {cls.arch: cls for cls in (MoteOptions, MoeOptions, CoMoeOptions)}
ARCHES = tuple(ARCH_OPTIONS)


@dataclass
class ArchChoice:
    """The option read first on `upcycle`'s command line: it picks the options class of the rest."""

    arch: Literal[ARCHES] = option(
        "mote", help="; ".join(f"{name}: {cls.summary}" for name, cls in ARCH_OPTIONS.items())
    )


def _arches_of(name: str) -> list[str]:
    """The architectures that have an option `name` (a field name)."""
    return sorted(arch for arch, cls in ARCH_OPTIONS.items() if name in {f.name for f in fields(cls)})


def upcycle_options(arch: str = "mote", **values) -> UpcycleOptions:
    """The upcycle options of `arch` (`MoteOptions`, `MoeOptions` or `CoMoeOptions`) from `values`: an option of
    another architecture is a `UsageError` naming the ones it applies to."""
    if arch not in ARCH_OPTIONS:
        raise UsageError(f"unknown arch {arch!r}; expected one of {', '.join(ARCHES)}")
    cls = ARCH_OPTIONS[arch]
    own = {f.name for f in fields(cls)}
    foreign = [name for name in values if name not in own and _arches_of(name)]
    if foreign:
        _refuse([f"--{name.replace('_', '-')}" for name in foreign], foreign, arch)
    return cls(**values)


def _refuse(flags: list[str], names: list[str], arch: str):
    arches = sorted({a for name in names for a in _arches_of(name)})
    verb = "applies" if len(flags) == 1 else "apply"
    raise UsageError(f"{', '.join(flags)} only {verb} to --arch {'/'.join(arches)} (this run is --arch {arch})")


def upcycle_parser(arch: str, description: str | None, prog: str | None = None) -> ArgumentParser:
    """`upcycle`'s command line for `--arch arch`: `--arch`, the options every architecture shares, this
    architecture's own in its group; `--help` lists every other architecture's own options after them, with
    their defaults."""
    cls = ARCH_OPTIONS[arch]
    parser = command_parser(description, prog)
    add_options(parser, ArchChoice)
    add_options(parser, UpcycleOptions)
    add_options(parser, cls, group=f"--arch {arch}", base=UpcycleOptions)
    parser.epilog = "\n".join(_arch_help(other, prog) for other in ARCH_OPTIONS if other != arch)
    return parser


def _arch_help(arch: str, prog: str | None) -> str:
    """The `--help` section of `arch`'s own options, as its own parser lists them."""
    parser = command_parser(None, prog)
    add_options(parser, ARCH_OPTIONS[arch], group=f"--arch {arch}", base=UpcycleOptions)
    formatter = parser._get_formatter()  # what argparse's own format_help does, for one group
    for group in parser._action_groups:
        if group.title == f"--arch {arch}":
            formatter.start_section(group.title)
            formatter.add_arguments(group._group_actions)
            formatter.end_section()
    return formatter.format_help()


def parse_upcycle_options(argv: list[str] | None, description: str | None, prog: str | None = None) -> UpcycleOptions:
    """`upcycle`'s command line: `--arch` is read first and picks the options class (`ARCH_OPTIONS`) whose parser
    reads the rest; an option of another architecture is refused naming the ones it applies to."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    arch = _given_arch(argv)
    parser = upcycle_parser(arch if arch in ARCH_OPTIONS else "mote", description, prog)  # a bad one: its error
    flags = [word.split("=")[0] for word in argv if word.startswith("--")]
    flags = [flag for flag in flags if flag not in parser._option_string_actions]
    renamed = {old: new for cls in ARCH_OPTIONS.values() for old, new in renamed_fields(cls).items()}
    for flag in flags:
        if flag[2:].replace("-", "_") in renamed:
            parser.error(renamed_message(flag, f"--{renamed[flag[2:].replace('-', '_')].replace('_', '-')}"))
    foreign = [flag for flag in flags if _arches_of(flag[2:].replace("-", "_"))]
    if foreign:
        _refuse(foreign, [flag[2:].replace("-", "_") for flag in foreign], arch)
    values = vars(parse(parser, argv))
    values.pop("verbose")
    return upcycle_options(**values)


def _given_arch(argv: list[str]) -> str:
    """The value of the last `--arch` in `argv` (as argparse reads it), default mote."""
    arch = "mote"
    for i, word in enumerate(argv):
        if word == "--arch" and i + 1 < len(argv):
            arch = argv[i + 1]
        elif word.startswith("--arch="):
            arch = word.partition("=")[2]
    return arch


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
    experts: list[str] | None = option(
        help="average only these experts: MoTE task names (e.g. clustering,document) or MoE indices (e.g. 0,3)"
    )
    weights: list[float] | None = option(help="comma-separated weights of the averaged experts (normalised)")
    calibration: str | Path | None = option(
        help="MoE / CoMoE: text file, one text per line; weight each layer's experts by their router usage on it"
    )
    dtype: Dtype | None = option(help="dtype of the saved weights (default: that of the input)")
    max_shard_size: str = option("2GB", type=shard_size, help="safetensors shard size above which weights are split")
    repo_id: str | None = option(help="Hub id shown in the model card's usage snippets")

    def __post_init__(self):
        if self.task and self.experts:
            raise UsageError("pass --task or --experts, not both")
        if self.calibration and self.weights:
            raise UsageError("pass --calibration or --weights, not both")
        check_choices(self)

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
        help="MoTE, token-routed MoE, CoMoE or dense (bert, roberta, xlm-roberta, mpnet, modernbert) folder",
    )
    task: str | None = option(help="MoTE: export only this task's experts, as a plain graph")
    task_ids_input: bool = option(False, help="MoTE: add a task_ids input (-1: the prompt decides)")
    quantize: Literal["int8"] | None = option(
        help="also write an onnxruntime int8 graph per CPU family (onnx/model_qint8_avx512_vnni.onnx, "
        "model_qint8_avx512.onnx, model_quint8_avx2.onnx, model_qint8_arm64.onnx, as sentence-transformers names "
        "them) and, with the openvino extra, openvino/openvino_model_qint8_quantized.xml (NNCF static int8)",
    )
    int8_variants: list[str] = option(
        default_factory=lambda: list(INT8_VARIANTS),
        help="with --quantize int8: the CPU families to write onnxruntime int8 graphs for, comma-separated, of "
        f"{', '.join(INT8_VARIANTS)} (default: all)",
        metavar="NAMES",
    )
    int8_min_cosine: float = option(
        DEFAULT_MIN_COSINE,
        help="refuse the int8 graph when a row's cosine to fp32 is below this (default: %(default)s)",
    )
    opset: int | None = option(help="ONNX opset, 18..23 (default: the exporter's)")
    tolerance: float = option(1e-4, help="largest |onnxruntime - torch| accepted (default: 1e-4)")

    def __post_init__(self):
        check_choices(self)
        if self.task_ids_input and self.task:
            raise UsageError("--task-ids-input applies to routed MoTE graphs (a MoTE folder without --task)")
        if self.opset is not None and not 18 <= self.opset <= 23:
            raise UsageError(f"--opset must lie in 18..23 (the dynamo exporter's range), got {self.opset}")
        if not 0 < self.int8_min_cosine <= 1:
            raise UsageError(f"--int8-min-cosine must lie in (0, 1], got {self.int8_min_cosine}")
        unknown = [name for name in self.int8_variants if name not in INT8_VARIANTS]
        if unknown or not self.int8_variants:
            raise UsageError(
                f"--int8-variants: unknown {', '.join(unknown) or 'empty list'}; expected names among "
                f"{', '.join(INT8_VARIANTS)}"
            )
        self.int8_variants = list(dict.fromkeys(self.int8_variants))
        if not self.quantize and self.int8_variants != list(INT8_VARIANTS):
            raise UsageError("--int8-variants applies with --quantize int8 (the int8 graphs it names)")


DEFAULT_ALPHAS = [float(alpha) for alpha in range(11)]


@dataclass
class CalibrateOptions:
    """What `calibrate` writes: the command line's options by their Python names (`moe-embed calibrate-aea
    --help`). Checked on construction, before any model is loaded."""

    model: str = option(required=True, positional=True, help="a supported MoE model: local folder or Hub id")
    output: str | Path = option(required=True, help="folder to write (refused if it exists, unless --overwrite)")
    overwrite: bool = option(False, help="replace an existing --output folder")
    calibration: str | Path | None = option(help="text file, one text per line (default: the STS-B dev sentences)")
    allocation: Literal["both", "layer", "token", "none"] = option(
        "both",
        help="both: layer- and token-wise (AEA); layer / token: one of them; none: the unmodified model with "
        "the same prompt, pooling and exit layer (the baseline)",
    )
    alpha: float = option(1.0, help="scaling α of (shift - s_l)^α (default 1)")
    shift: float = option(1.0, help="c in (c - s_l)^α: 1 is the paper's rule, 0.1 its Qwen variant")
    exit_layer: int | None = option(
        help="number of layers whose output is embedded, 1..L (default L-1 for decoders, L for encoders)"
    )
    rounding: Literal[AEA_ROUNDINGS] = option(
        "floor",
        help="per-token counts: the paper's floor, or largest remainder (spends each layer's budget exactly)",
    )
    embedding: Literal[AEA_EMBEDDINGS] = option(
        "hidden",
        help="hidden: the pooled hidden state; moee-concat / moee-sum: MoEE with the routing weights",
    )
    prompt: str | None = option(help="template with [TEXT] (default PromptEOL for decoders, the text for encoders)")
    pooling: Literal["last", "mean"] | None = option(help="default last for decoders, mean for encoders")
    search: bool = option(False, help="choose --alpha and --exit-layer on the STS-B dev pairs")
    alphas: list[float] = option(
        default_factory=lambda: list(DEFAULT_ALPHAS), help="--search grid of α (default 0,1,...,10)"
    )
    exit_layers: list[int] | None = option(help="--search grid of exit layers (default the last four)")
    data_dir: str | None = option(help=DATA_DIR_HELP)
    batch_size: int = option(64, help="texts per forward pass")
    max_length: int = option(256, help="truncate texts to this many tokens")

    def __post_init__(self):
        check_choices(self)
        if self.alpha < 0:
            raise UsageError(f"--alpha must be >= 0, got {self.alpha}")
        if self.prompt is not None and "[TEXT]" not in self.prompt:
            raise UsageError(f"--prompt must contain [TEXT] where the text goes, got {self.prompt!r}")
        if self.batch_size < 1 or self.max_length < 1:
            raise UsageError("--batch-size and --max-length must be positive integers")
