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

from dataclasses import MISSING, fields
from pathlib import Path

from moe_embed.convert.options import ARCHES, DEFAULT_OUTPUTS, DTYPES, SHARED_DEFAULTS, UpcycleOptions
from moe_embed.modeling.defaults import DEFAULT_TASK
from moe_embed.usage import command_parser, parse, run_cli, shard_size


def upcycle(options: UpcycleOptions) -> Path:
    """Write the model folder `options` describe; returns its path.

    The base is opened first (a missing one is reported before anything about the output), then the
    output checked, then the model built, checked against the dense model and written atomically."""
    from moe_embed.folders import bundled_minilm_path, check_output, locate

    source = Path(bundled_minilm_path()) if options.base is None else locate(options.base)
    output = check_output(options.output, (source,), options.overwrite)
    from moe_embed.convert.builders import write_upcycled  # the model code: imported once the inputs are known good

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
