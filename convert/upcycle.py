"""Upcycle a dense BERT-style checkpoint into an expert model folder.

    python convert/upcycle.py                                  # bundled all-MiniLM-L6-v2 -> models/mote-minilm
    python convert/upcycle.py --base sentence-transformers/all-mpnet-base-v2 --expert-layers all
    python convert/upcycle.py --arch moe --num-experts 8 --experts-per-token 2   # -> models/moe-minilm
    python convert/upcycle.py --arch comoe --num-experts 4 --experts-per-token 2 --rank 16 --lora-alpha 32

Every expert starts as a copy of the dense layer it replaces (CoMoE: a LoRA expert with B = 0). A
MoTE model, a CoMoE model, and a token-routed MoE with renormalised top-k weights and no expert
noise then compute the dense model's function; the converter checks that before writing. The output folder loads with
`AutoModel.from_pretrained(..., trust_remote_code=True)` and `SentenceTransformer(..., trust_remote_code=True)`.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as `python convert/upcycle.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from tqdm.auto import tqdm

from convert.cards import PLACEHOLDER_OWNER, render_card, source_license
from convert.checkpoint import (
    atomic_output_dir,
    check_shard_size,
    copy_modeling_files,
    copy_tokenizer_files,
    encoder_config_kwargs,
    load_tokenizer,
    map_state_dict,
    parse_dtype,
    read_dense_checkpoint,
    read_json,
    resolve_source,
    write_sentence_transformers_files,
)
from convert.folders import check_output
from convert.layout import comoe_adapter_keys, moe_router_key, moe_stacked_key, mote_expert_key, mote_key
from modeling.compat import REQUIREMENTS
from modeling.configuration_comoe import CoMoeBertConfig
from modeling.configuration_moe import MoeBertConfig
from modeling.configuration_mote import DEFAULT_TASK_PREFIXES, MoteBertConfig
from modeling.manifest import FOLDER_FILES, ST_MODULES
from modeling.modeling_comoe import CoMoeBertModel
from modeling.modeling_moe import MoeBertModel
from modeling.modeling_mote import MoteBertModel
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("upcycle")
# The expert a plain `encode(texts)` uses: the MoTE paper routes STS and other generic similarity
# tasks to the classification expert (section 5.3).
DEFAULT_TASK = "classification"


@dataclass
class Upcycled:
    """An upcycled model (fp32, eval mode) and what its folder needs besides the weights."""

    model: torch.nn.Module
    prompts: dict[str, str]
    exact: bool = True  # whether the untrained model must reproduce the dense model
    default_prompt_name: str | None = None  # the prompt `SentenceTransformer.encode` uses when given none
    module_settings: dict | None = None  # extra settings of the Sentence-Transformers input module


def parse_task_prefixes(specs: list[str]) -> dict[str, str]:
    """`NAME=PREFIX` (or a bare known NAME) per task, in order, to `{name: prefix}`."""
    tasks = {}
    for spec in specs:
        name, sep, prefix = spec.partition("=")
        name = name.strip()
        if not sep:
            if name not in DEFAULT_TASK_PREFIXES:
                raise UsageError(
                    f"task {name!r} needs a prefix: write {name}='{name}: ' (known defaults: "
                    f"{', '.join(DEFAULT_TASK_PREFIXES)})"
                )
            prefix = DEFAULT_TASK_PREFIXES[name]
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise UsageError(f"task name {name!r} must be an identifier (letters, digits, underscores)")
        if not prefix.strip():
            raise UsageError(f"task {name!r} has an empty prefix; routing by prefix needs text")
        if name in tasks:
            raise UsageError(f"task {name!r} is given twice")
        tasks[name] = prefix
    if not tasks:
        raise UsageError("--tasks needs at least one task")
    return tasks


def prefix_token_ids(tokenizer, prefix: str) -> list[int]:
    """Token ids every input starting with `prefix` starts with (leading special tokens included).

    Found as the common start of two tokenized texts that begin with the prefix and then differ in
    their first character, so it works for WordPiece, BPE and SentencePiece alike.
    """
    first = tokenizer(prefix + "hello world")["input_ids"]
    second = tokenizer(prefix + "42 apples")["input_ids"]
    common = []
    for a, b in zip(first, second, strict=False):
        if a != b:
            break
        common.append(a)
    bare = tokenizer("hello world")["input_ids"]
    leading = 0
    while (
        leading < len(bare)
        and leading < len(common)
        and bare[leading] == common[leading]
        and bare[leading] in tokenizer.all_special_ids
    ):
        leading += 1
    if len(common) <= leading:
        raise UsageError(f"prefix {prefix!r} produces no tokens of its own with this tokenizer")
    return common


def mote_rename(expert_layers: set[int], num_tasks: int):
    """Dense key -> MoTE keys: expert parts of expert layers go to every expert, the rest is shared."""

    def rename(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        expert_key = mote_expert_key(key)
        if expert_key is None or expert_key[0] not in expert_layers:
            return [(key, tensor)]
        layer, inner = expert_key
        # Each expert gets its own copy: tensors must not share memory in safetensors.
        return [(mote_key(layer, e, inner), tensor.clone()) for e in range(num_tasks)]

    return rename


def moe_rename(moe_layers: set[int], num_experts: int, noise_std: float, generator: torch.Generator):
    """Dense key -> token-routed MoE keys: FFN projections of MoE layers are stacked once per expert."""

    def rename(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        stacked_key = moe_stacked_key(key)
        if stacked_key is None or stacked_key[0] not in moe_layers:
            return [(key, tensor)]
        stacked = tensor.unsqueeze(0).repeat(num_experts, *([1] * tensor.dim()))
        if noise_std > 0 and key.endswith(".weight"):
            stacked = stacked + noise_std * torch.randn(stacked.shape, generator=generator)
        return [(stacked_key[1], stacked)]

    return rename


def fill_model(model_cls, config, dense_state: dict, rename, new_tensors: dict | None = None):
    """Build `model_cls(config)` on the meta device and fill it from the mapped dense weights."""
    with torch.device("meta"):
        model = model_cls(config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    mapped = map_state_dict(dense_state, shapes, rename, new_tensors)
    mapped = {k: v.detach().float().contiguous() for k, v in tqdm(mapped.items(), desc="upcycling", unit="tensor")}
    model.load_state_dict(mapped, strict=True, assign=True)
    return model.eval()


def initial_tensors(model_cls, config, keys: list[str], seed: int) -> dict[str, torch.Tensor]:
    """The tensors `keys` as the model's own `_init_weights` initialises them, under `seed` (one copy of
    the initialisation: upcycling adds routers and adapters exactly as a fresh model has them)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = model_cls(config).state_dict()
    return {key: state[key].detach().clone() for key in keys}


def _config(config_cls, **kwargs):
    try:
        return config_cls(**kwargs)
    except ValueError as error:
        raise UsageError(str(error)) from None


def build_mote(args, dense_config: dict, dense_state: dict, tokenizer) -> Upcycled:
    """MoTE: one expert per task in `--expert-layers`, routed per sequence by the task prefix."""
    tasks = parse_task_prefixes(args.tasks)
    prefix_ids = {name: prefix_token_ids(tokenizer, prefix) for name, prefix in tasks.items()}
    seen = {}
    for name, ids in prefix_ids.items():
        if tuple(ids) in seen:
            raise UsageError(f"tasks {seen[tuple(ids)]!r} and {name!r} have prefixes that tokenize identically")
        seen[tuple(ids)] = name
    if args.strict_routing and args.default_task is not None:
        raise UsageError("pass --default-task or --strict-routing, not both")
    default_task = args.default_task
    if default_task is None and not args.strict_routing and DEFAULT_TASK in tasks:
        default_task = DEFAULT_TASK
    elif default_task is None and not args.strict_routing:
        logger.warning(
            "no %r task: inputs without a task or prefix will be an error (see --default-task)", DEFAULT_TASK
        )
    config = _config(
        MoteBertConfig,
        **encoder_config_kwargs(dense_config, dense_state),
        tasks=list(tasks),
        task_prefixes=tasks,
        task_prefix_ids=prefix_ids,
        default_task=default_task,
        expert_layers=args.expert_layers,
    )
    model = fill_model(MoteBertModel, config, dense_state, mote_rename(set(config.expert_layers), config.num_tasks))
    return Upcycled(
        model=model,
        prompts=with_passage(tasks),
        default_prompt_name=config.default_task,
        module_settings={"prepend_task_prefix": False} if args.prefix_routes_only else None,
    )


def build_moe(args, dense_config: dict, dense_state: dict, tokenizer) -> Upcycled:
    """Token-routed sparse MoE (Nomic Embed v2): every MoE layer's FFN copied into each expert."""
    config = _config(
        MoeBertConfig,
        **encoder_config_kwargs(dense_config, dense_state),
        num_local_experts=arch_default(args, "num_experts"),
        num_experts_per_tok=arch_default(args, "experts_per_token"),
        moe_layers=args.moe_layers,
        norm_topk_prob=args.norm_topk_prob,
        router_aux_loss_coef=arch_default(args, "router_aux_loss_coef"),
        router_z_loss_coef=args.router_z_loss_coef,
        router_jitter_noise=args.router_jitter_noise,
    )
    if args.expert_noise < 0:
        raise UsageError(f"--expert-noise must be >= 0, got {args.expert_noise}")
    generator = torch.Generator().manual_seed(args.seed)
    routers = initial_tensors(MoeBertModel, config, [moe_router_key(layer) for layer in config.moe_layers], args.seed)
    if args.router_init == "zeros":
        routers = {key: torch.zeros_like(tensor) for key, tensor in routers.items()}
    rename = moe_rename(set(config.moe_layers), config.num_local_experts, args.expert_noise, generator)
    model = fill_model(MoeBertModel, config, dense_state, rename, new_tensors=routers)
    return Upcycled(
        model=model,
        prompts=with_passage(parse_task_prefixes(args.tasks)),
        exact=config.norm_topk_prob and args.expert_noise == 0,
    )


def build_comoe(args, dense_config: dict, dense_state: dict, tokenizer) -> Upcycled:
    """CoMoE-PEFT: the dense weights unchanged (frozen), LoRA experts with B = 0 and routers added."""
    config = _config(
        CoMoeBertConfig,
        **encoder_config_kwargs(dense_config, dense_state),
        num_local_experts=arch_default(args, "num_experts"),
        num_experts_per_tok=arch_default(args, "experts_per_token"),
        lora_rank=args.rank,
        lora_alpha=args.lora_alpha,
        lora_dropout=args.lora_dropout,
        target_modules=args.target_modules,
        adapter_layers=args.layers,
        contrastive_loss_coef=args.contrastive_loss_coef,
        contrastive_tau=args.contrastive_tau,
        router_aux_loss_coef=arch_default(args, "router_aux_loss_coef"),
        base_model_name_or_path=args.base_model_name_or_path,
    )
    missing = [name for name in config.adapted_linears() if f"{name}.weight" not in dense_state]
    if missing:
        raise UsageError(f"the dense checkpoint has no {missing[0]}.weight to put LoRA experts on")
    keys = [key for name in config.adapted_linears() for key in comoe_adapter_keys(name).values()]
    adapters = initial_tensors(CoMoeBertModel, config, keys, args.seed)  # B = 0: the model starts as the base
    model = fill_model(CoMoeBertModel, config, dense_state, lambda key, tensor: [(key, tensor)], adapters)
    return Upcycled(
        model=model,
        prompts=with_passage(parse_task_prefixes(args.tasks)),
    )


def save_dense_with_prompts(expert_model: str | Path, output: str | Path, base: str | Path | None = None) -> None:
    """Save the dense `base` (default: the bundled MiniLM) with the prompts of an upcycled expert model.

    This is instruction conditioning (IC) with exactly the inputs the expert model sees: the baseline
    that MoTE is compared with in the experiment, the inter-task analysis and the training benchmark.
    """
    from sentence_transformers import SentenceTransformer

    path = Path(expert_model) / "config_sentence_transformers.json"
    prompts = read_json(path).get("prompts")
    if not prompts:
        raise UsageError(f"expected an expert model folder with prompts in {path}")
    SentenceTransformer(str(resolve_source(None if base is None else str(base))), prompts=prompts).save(str(output))


def with_passage(prompts: dict[str, str]) -> dict[str, str]:
    """Sentence-Transformers prompts: the task prefixes, plus `passage` (ST's other name for documents)."""
    prompts = dict(prompts)
    if "document" in prompts:
        prompts.setdefault("passage", prompts["document"])
    return prompts


def verify_against_dense(model, tokenizer, source: Path, dense_state: dict, prompts: dict[str, str]) -> float:
    """Largest |difference| between the upcycled and the dense model's hidden states, over all prompts.

    A MoTE model routes each batch by the prefix it starts with.
    """
    from transformers import AutoConfig, AutoModel

    dense_config = AutoConfig.from_pretrained(str(source))
    dense = AutoModel.from_config(dense_config, add_pooling_layer=model.pooler is not None).eval()
    dense.load_state_dict(dense_state, strict=False)
    texts = ["Isaac Newton formulated the laws of motion.", "a short text"]
    worst = 0.0
    with torch.no_grad():
        for prefix in prompts.values():
            batch = tokenizer([prefix + t for t in texts], padding=True, return_tensors="pt")
            mask = batch["attention_mask"].bool()
            diff = dense(**batch).last_hidden_state - model(**batch).last_hidden_state
            worst = max(worst, diff[mask].abs().max().item())
    return worst


BUILDERS = {"mote": build_mote, "moe": build_moe, "comoe": build_comoe}
# option -> the architectures it applies to
ARCH_OPTIONS = {
    "expert_layers": ("mote",),
    "default_task": ("mote",),
    "strict_routing": ("mote",),
    "prefix_routes_only": ("mote",),
    "num_experts": ("moe", "comoe"),
    "experts_per_token": ("moe", "comoe"),
    "router_aux_loss_coef": ("moe", "comoe"),
    "seed": ("moe", "comoe"),
    "moe_layers": ("moe",),
    "norm_topk_prob": ("moe",),
    "router_init": ("moe",),
    "expert_noise": ("moe",),
    "router_z_loss_coef": ("moe",),
    "router_jitter_noise": ("moe",),
    "rank": ("comoe",),
    "lora_alpha": ("comoe",),
    "lora_dropout": ("comoe",),
    "target_modules": ("comoe",),
    "layers": ("comoe",),
    "contrastive_loss_coef": ("comoe",),
    "contrastive_tau": ("comoe",),
}
# defaults of options shared by architectures that differ between them (the papers' settings)
ARCH_DEFAULTS = {
    option: {"moe": getattr(MoeBertConfig, field), "comoe": getattr(CoMoeBertConfig, field)}
    for option, field in (
        ("num_experts", "num_local_experts"),
        ("experts_per_token", "num_experts_per_tok"),
        ("router_aux_loss_coef", "router_aux_loss_coef"),
    )
}


def per_arch(option: str) -> str:
    """The defaults of a shared option, for `--help`."""
    return ", ".join(f"{value} for {arch}" for arch, value in ARCH_DEFAULTS[option].items())


def arch_default(args, option: str):
    """The value of a shared option: as given, else the default of `args.arch`."""
    value = getattr(args, option)
    return ARCH_DEFAULTS[option][args.arch] if value is None else value


def refuse_flags_of_other_architectures(args) -> None:
    """Options of another --arch are an error, not silently ignored."""
    defaults = vars(build_parser().parse_args([]))
    given = [o for o, archs in ARCH_OPTIONS.items() if args.arch not in archs and getattr(args, o) != defaults[o]]
    if given:
        names = ", ".join(f"--{o.replace('_', '-')}" for o in given)
        archs = sorted({a for o in given for a in ARCH_OPTIONS[o]})
        raise UsageError(f"{names} only apply to --arch {'/'.join(archs)} (this run is --arch {args.arch})")


DEFAULT_OUTPUTS = {"mote": "models/mote-minilm", "moe": "models/moe-minilm", "comoe": "models/comoe-minilm"}


def upcycle(args) -> Path:
    """Write the model folder `args` describes; returns its path."""
    refuse_flags_of_other_architectures(args)
    output = check_output(args.output or DEFAULT_OUTPUTS[args.arch], overwrite=args.overwrite)  # before any work
    source = resolve_source(args.base)
    check_output(output, (source,), args.overwrite)
    local_base = args.base is not None and Path(args.base).is_dir()
    base_name = args.base or "sentence-transformers/all-MiniLM-L6-v2"
    dtype = parse_dtype(args.dtype)
    logger.info("reading dense checkpoint %s", source)
    dense_config, dense_state = read_dense_checkpoint(source)
    tokenizer = load_tokenizer(source)
    # what an adapter-only CoMoE folder loads its base from: the Hub id, or this local folder
    args.base_model_name_or_path = base_name if args.base and not local_base else str(source.resolve())
    upcycled = BUILDERS[args.arch](args, dense_config, dense_state, tokenizer)
    if args.no_verify:
        logger.info("skipping the check against the dense model (--no-verify)")
    elif not upcycled.exact:
        logger.info(
            "not checking against the dense model: without --norm-topk-prob, or with expert noise, "
            "the upcycled model is not meant to reproduce it"
        )
    else:
        worst = verify_against_dense(upcycled.model, tokenizer, source, dense_state, upcycled.prompts)
        logger.info("max |upcycled - dense| over all prompts: %.2e", worst)
        if worst > 1e-4:
            raise UsageError(f"upcycled model differs from the dense model by {worst:.2e} (> 1e-4)")
    model = upcycled.model.to(dtype)
    with atomic_output_dir(output, args.overwrite) as tmp:
        type(model.config).register_for_auto_class()
        type(model).register_for_auto_class("AutoModel")
        # save_pretrained copies the model's code (the registered classes and their sibling imports);
        # the Sentence-Transformers module is not reached from it, so it is copied here.
        model.config.requirements = dict(REQUIREMENTS)  # not a field: saved as it is, kept by later saves
        model.save_pretrained(tmp, max_shard_size=args.max_shard_size)
        model_type = model.config.model_type
        copy_modeling_files(tmp, FOLDER_FILES[model_type])
        copy_tokenizer_files(source, tmp)
        write_sentence_transformers_files(
            source,
            tmp,
            ST_MODULES[model_type],
            upcycled.prompts,
            default_prompt_name=upcycled.default_prompt_name,
            module_settings=upcycled.module_settings,
        )
        render_card(
            tmp,
            args.repo_id or f"{PLACEHOLDER_OWNER}/{output.name}",
            base_model=base_name,
            base_is_hub_id=not local_base,
            license_id=source_license(source),
            untrained=True,
        )
    print(f"wrote {output} ({args.arch}, {args.dtype})")
    return output


def upcycle_folder(output: str | Path, arch: str = "mote", base: str | None = None, overwrite: bool = False, **options):
    """`upcycle.py` as a function: write the `arch` folder of the dense `base` (default: the bundled MiniLM)
    to `output`; `options` are the command's options by their Python names (`num_experts=4`, `seed=1`)."""
    args = build_parser().parse_args([])
    unknown = sorted(set(options) - set(vars(args)))
    if unknown:
        raise TypeError(f"unknown upcycle options {unknown}; expected names from {sorted(vars(args))}")
    if arch not in BUILDERS:
        raise UsageError(f"unknown arch {arch!r}; expected one of {', '.join(BUILDERS)}")
    vars(args).update(options, arch=arch, base=base, output=str(output), overwrite=overwrite)
    return upcycle(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--arch",
        choices=sorted(BUILDERS),
        default="mote",
        help="mote: one expert per task, routed per sequence by the instruction; "
        "moe: token-routed top-k experts (Nomic Embed v2); "
        "comoe: top-k routed LoRA experts on a frozen encoder (CoMoE-PEFT)",
    )
    parser.add_argument(
        "--base",
        default=None,
        help="local folder or Hub id of the dense checkpoint (default: the bundled all-MiniLM-L6-v2)",
    )
    parser.add_argument(
        "--output", default=None, help="folder to write (default: models/mote-minilm, moe-minilm or comoe-minilm)"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--tasks",
        nargs="+",
        default=[f"{t}={p}" for t, p in DEFAULT_TASK_PREFIXES.items()],
        metavar="NAME=PREFIX",
        help="tasks, each NAME=PREFIX (or a known NAME alone): MoTE's experts in order; "
        "for both architectures the Sentence-Transformers prompts",
    )
    mote = parser.add_argument_group("mote")
    mote.add_argument(
        "--expert-layers",
        default="every_other",
        help="layers that get task experts: all, every_other (1,3,5,...) or comma-separated indices",
    )
    mote.add_argument(
        "--default-task",
        default=None,
        help=f"task (expert and Sentence-Transformers default prompt) for inputs that name none and carry no "
        f"prefix, so that a plain encode(texts) works (default: {DEFAULT_TASK} where it is a task, the MoTE "
        "paper's choice for STS)",
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
    shared.add_argument(
        "--num-experts",
        type=int,
        default=None,
        help=f"experts per MoE layer / per CoMoE linear (default: {per_arch('num_experts')})",
    )
    shared.add_argument(
        "--experts-per-token",
        type=int,
        default=None,
        help=f"experts each token is routed to, top-k (default: {per_arch('experts_per_token')})",
    )
    shared.add_argument(
        "--router-aux-loss-coef",
        type=float,
        default=None,
        help=f"load-balancing loss weight (default: {per_arch('router_aux_loss_coef')}, the papers' choices)",
    )
    shared.add_argument("--seed", type=int, default=0, help="seed for the router and LoRA init and expert noise")
    moe = parser.add_argument_group("moe")
    moe.add_argument(
        "--moe-layers",
        default=MoeBertConfig.moe_layers,
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
        default="normal",
        help="router weights: normal(0, initializer_range) or zeros (uniform routing)",
    )
    moe.add_argument(
        "--expert-noise",
        type=float,
        default=0.0,
        help="std of Gaussian noise added to each expert's weights to break symmetry",
    )
    moe.add_argument(
        "--router-z-loss-coef", type=float, default=MoeBertConfig.router_z_loss_coef, help="router z-loss weight"
    )
    moe.add_argument(
        "--router-jitter-noise",
        type=float,
        default=MoeBertConfig.router_jitter_noise,
        help="router input jitter in training",
    )
    comoe = parser.add_argument_group("comoe")
    comoe.add_argument("--rank", type=int, default=CoMoeBertConfig.lora_rank, help="LoRA rank r of every expert")
    comoe.add_argument(
        "--lora-alpha",
        type=float,
        default=CoMoeBertConfig.lora_alpha,
        help="LoRA alpha (experts are scaled by alpha / r)",
    )
    comoe.add_argument(
        "--lora-dropout",
        type=float,
        default=CoMoeBertConfig.lora_dropout,
        help="dropout on the experts' input in training",
    )
    comoe.add_argument(
        "--target-modules",
        default=CoMoeBertConfig.target_modules,
        help="linears that get experts, matched as peft's target_modules "
        "(query, key, value, attention.output.dense, intermediate.dense, output.dense)",
    )
    comoe.add_argument(
        "--layers",
        default=CoMoeBertConfig.adapter_layers,
        help="layers whose target linears get experts: all, every_other or indices",
    )
    comoe.add_argument(
        "--contrastive-loss-coef",
        type=float,
        default=CoMoeBertConfig.contrastive_loss_coef,
        help="weight λ of the contrastive expert loss (0: MoE-LoRA)",
    )
    comoe.add_argument(
        "--contrastive-tau",
        type=float,
        default=CoMoeBertConfig.contrastive_tau,
        help="temperature of the contrastive expert loss",
    )
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "float16", "bfloat16"], help="dtype of the saved weights"
    )
    parser.add_argument(
        "--max-shard-size",
        default="2GB",
        type=check_shard_size,
        help="safetensors shard size above which weights are split",
    )
    parser.add_argument("--repo-id", default=None, help="Hub id shown in the model card's usage snippets")
    parser.add_argument(
        "--no-verify", action="store_true", help="skip the check that the upcycled model reproduces the dense model"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    upcycle(args)


if __name__ == "__main__":
    run_cli(main)
