"""Upcycle a dense BERT-style checkpoint into an expert model folder.

    moe-embed upcycle                                 # bundled all-MiniLM-L6-v2 -> models/mote-minilm
    moe-embed upcycle --base sentence-transformers/all-mpnet-base-v2 --expert-layers all
    moe-embed upcycle --arch moe --num-experts 8 --experts-per-token 2     # -> models/moe-minilm
    moe-embed upcycle --arch comoe --num-experts 4 --experts-per-token 2 --rank 16 --lora-alpha 32

(`python convert/upcycle.py ...` is the same command.) Every expert starts as a copy of the dense layer it
replaces (CoMoE: a LoRA expert with B = 0). A MoTE model, a CoMoE model, and a token-routed MoE with
renormalised top-k weights and no expert noise then compute the dense model's function; the converter
checks that before writing. The output folder loads with `AutoModel.from_pretrained(..., trust_remote_code=True)`
and `SentenceTransformer(..., trust_remote_code=True)`; it is written atomically, the input is never touched,
and an existing output is replaced only with `--overwrite`.
"""

from __future__ import annotations

import difflib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path

from convert.task_prefixes import parse_task_prefixes
from modeling.defaults import COMOE, DEFAULT_TASK, DEFAULT_TASK_PREFIXES, MOE
from moe_embed.usage import UsageError, command_parser, parse, run_cli, shard_size

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


def upcycle(options: UpcycleOptions) -> Path:
    """Write the model folder `options` describe; returns its path.

    The base is opened first (a missing one is reported before anything about the output), then the
    output checked, then the model built, checked against the dense model and written atomically."""
    from moe_embed.folders import bundled_minilm_path, check_output, locate

    source = Path(bundled_minilm_path()) if options.base is None else locate(options.base)
    output = check_output(options.output, (source,), options.overwrite)
    from convert.builders import write_upcycled  # the model code: imported once the inputs are known good

    return write_upcycled(options, source, output)


def default_of(name: str):
    """The default of an `UpcycleOptions` field (the command line shows and uses the same)."""
    spec = next(f for f in fields(UpcycleOptions) if f.name == name)
    return spec.default_factory() if spec.default is MISSING else spec.default


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog)
    parser.add_argument(
        "--arch",
        choices=ARCHES,
        default=default_of("arch"),
        help="mote: one expert per task, routed per sequence by the instruction; "
        "moe: token-routed top-k experts (Nomic Embed v2); "
        "comoe: top-k routed LoRA experts on a frozen encoder (CoMoE-PEFT)",
    )
    parser.add_argument(
        "--base", help="local folder or Hub id of the dense checkpoint (default: the bundled all-MiniLM-L6-v2)"
    )
    parser.add_argument(
        "--output", help=f"folder to write (default: {', '.join(f'{v} for {k}' for k, v in DEFAULT_OUTPUTS.items())})"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=[f"{task}={prefix}" for task, prefix in default_of("tasks").items()],
        metavar="NAME=PREFIX",
        help="tasks, each NAME=PREFIX (or a known NAME alone): MoTE's experts in order; "
        "for every architecture the Sentence-Transformers prompts",
    )
    mote = parser.add_argument_group("mote")
    mote.add_argument(
        "--expert-layers",
        default=default_of("expert_layers"),
        help="layers that get task experts: all, every_other (1,3,5,...) or comma-separated indices",
    )
    mote.add_argument(
        "--default-task",
        help=f"task of inputs that name none and carry no prefix, so that a plain encode(texts) works "
        f"(default: {DEFAULT_TASK} where it is a task, the MoTE paper's expert for STS)",
    )
    mote.add_argument(
        "--prefix-routes-only",
        action="store_true",
        help="Sentence-Transformers: a task prefix (prompt, or at the start of a text) only picks the expert and "
        "is removed before the encoder, so the untrained model embeds plain text as the dense model does; "
        "without it the prefix is also fed, the paper's choice",
    )
    mote.add_argument(
        "--strict-routing",
        action="store_true",
        help="no default task: inputs that name no task and carry no prefix are an error",
    )
    shared = parser.add_argument_group("moe and comoe")
    for option, text in (
        ("num_experts", "experts per MoE layer / per CoMoE linear"),
        ("experts_per_token", "experts each token is routed to, top-k"),
        ("router_aux_loss_coef", "load-balancing loss weight"),
    ):
        defaults = ", ".join(f"{value} for {arch}" for arch, value in SHARED_DEFAULTS[option].items())
        kind = int if option != "router_aux_loss_coef" else float
        shared.add_argument(f"--{option.replace('_', '-')}", type=kind, help=f"{text} (default: {defaults})")
    shared.add_argument(
        "--seed", type=int, default=default_of("seed"), help="seed of the router and LoRA init and expert noise"
    )
    moe = parser.add_argument_group("moe")
    moe.add_argument(
        "--moe-layers",
        default=default_of("moe_layers"),
        help="layers whose FFN becomes an MoE block: every_other (1,3,5,...), all, or indices",
    )
    moe.add_argument(
        "--norm-topk-prob",
        action="store_true",
        help="renormalise the top-k router weights to sum to 1 (then the upcycled model equals the dense one)",
    )
    moe.add_argument(
        "--router-init",
        choices=["normal", "zeros"],
        default=default_of("router_init"),
        help="router weights: normal(0, initializer_range) or zeros (uniform routing)",
    )
    moe.add_argument(
        "--expert-noise",
        type=float,
        default=default_of("expert_noise"),
        help="std of Gaussian noise added to each expert's weights to break symmetry",
    )
    moe.add_argument(
        "--router-z-loss-coef", type=float, default=default_of("router_z_loss_coef"), help="router z-loss weight"
    )
    moe.add_argument(
        "--router-jitter-noise",
        type=float,
        default=default_of("router_jitter_noise"),
        help="router input jitter in training",
    )
    comoe = parser.add_argument_group("comoe")
    comoe.add_argument("--rank", type=int, default=default_of("rank"), help="LoRA rank r of every expert")
    comoe.add_argument(
        "--lora-alpha",
        type=float,
        default=default_of("lora_alpha"),
        help="LoRA alpha (experts are scaled by alpha / r)",
    )
    comoe.add_argument(
        "--lora-dropout",
        type=float,
        default=default_of("lora_dropout"),
        help="dropout on the experts' input in training",
    )
    comoe.add_argument(
        "--target-modules",
        default=default_of("target_modules"),
        help="linears that get experts, matched as peft's target_modules "
        "(query, key, value, attention.output.dense, intermediate.dense, output.dense)",
    )
    comoe.add_argument(
        "--layers",
        default=default_of("layers"),
        help="layers whose target linears get experts: all, every_other or indices",
    )
    comoe.add_argument(
        "--contrastive-loss-coef",
        type=float,
        default=default_of("contrastive_loss_coef"),
        help="weight λ of the contrastive expert loss (0: MoE-LoRA)",
    )
    comoe.add_argument(
        "--contrastive-tau",
        type=float,
        default=default_of("contrastive_tau"),
        help="temperature of the contrastive expert loss",
    )
    parser.add_argument("--dtype", default=default_of("dtype"), choices=DTYPES, help="dtype of the saved weights")
    parser.add_argument(
        "--max-shard-size",
        default=default_of("max_shard_size"),
        type=shard_size,
        help="safetensors shard size above which weights are split",
    )
    parser.add_argument("--repo-id", help="Hub id shown in the model card's usage snippets")
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the check that the upcycled model reproduces the dense model"
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    args = vars(parse(build_parser(prog), argv))
    args.pop("verbose")
    return upcycle(UpcycleOptions(**args))


if __name__ == "__main__":
    run_cli(main)
