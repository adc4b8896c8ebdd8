"""The upcycling itself: a dense checkpoint's weights mapped into a MoTE, token-routed MoE or CoMoE model
(`convert/layout.py` says which key goes where), the result checked against the dense model, and the folder
written. `convert/upcycle.py` is the command and its options; this file is what it runs.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from moe_embed.convert.bases import base_of
from moe_embed.convert.cards import PLACEHOLDER_OWNER, render_card, source_license
from moe_embed.convert.checkpoint import (
    DenseCheckpoint,
    load_tokenizer,
    map_state_dict,
    parse_dtype,
    read_dense_checkpoint,
)
from moe_embed.convert.folder_writer import write_model_folder
from moe_embed.convert.layout import comoe_adapter_keys, moe_rename, moe_router_key, mote_rename
from moe_embed.convert.task_prefixes import leading_special_tokens, prefix_token_ids
from moe_embed.errors import UsageError
from moe_embed.files import atomic_output_dir
from moe_embed.folders import BUNDLED_MODEL_ID, is_bundled
from moe_embed.modeling.compat import REQUIREMENTS
from moe_embed.modeling.configuration_comoe import CoMoeBertConfig
from moe_embed.modeling.configuration_moe import MoeBertConfig
from moe_embed.modeling.configuration_mote import MoteBertConfig
from moe_embed.modeling.defaults import sentence_transformers_prompts
from moe_embed.modeling.manifest import ST_MODULES
from moe_embed.modeling.modeling_comoe import CoMoeBertModel
from moe_embed.modeling.modeling_moe import MoeBertModel
from moe_embed.modeling.modeling_mote import MoteBertModel

if TYPE_CHECKING:
    from moe_embed.convert.options import CoMoeOptions, MoeOptions, MoteOptions, UpcycleOptions

logger = logging.getLogger(__name__)
# the agreement with the dense model an untrained upcycled model must reach (fp32)
DENSE_TOLERANCE = 1e-4


@dataclass
class Upcycled:
    """An upcycled model (fp32, eval mode) and what its folder needs besides the weights."""

    model: torch.nn.Module
    prompts: dict[str, str]
    exact: bool = True  # whether the untrained model must reproduce the dense model


def fill_model(model_cls, config, dense_state: dict, rename, new_tensors: dict | None = None):
    """Build `model_cls(config)` on the meta device and fill it from the mapped dense weights."""
    with torch.device("meta"):
        model = model_cls(config)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    mapped = map_state_dict(dense_state, shapes, rename, new_tensors)
    mapped = {k: v.detach().float().contiguous() for k, v in mapped.items()}
    model.load_state_dict(mapped, strict=True, assign=True)
    return model.eval()


def initial_tensors(model_cls, config, keys: list[str], seed: int) -> dict[str, torch.Tensor]:
    """The tensors `keys` as the model's own `_init_weights` initialises them, under `seed` (one copy of
    the initialisation: upcycling adds routers and adapters exactly as a fresh model has them)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        state = model_cls(config).state_dict()
    return {key: state[key].detach().clone() for key in keys}


def make_config(config_cls, **kwargs):
    """`config_cls(**kwargs)`, its `ValueError` (a bad option value) as a `UsageError`."""
    try:
        return config_cls(**kwargs)
    except ValueError as error:
        raise UsageError(str(error)) from None


def build_mote(options: MoteOptions, dense: DenseCheckpoint, tokenizer) -> Upcycled:
    """MoTE: one expert per task in `expert_layers`, routed per sequence by the task."""
    tasks = options.tasks
    prefix_ids = {name: prefix_token_ids(tokenizer, prefix) for name, prefix in tasks.items()}
    seen = {}
    for name, ids in prefix_ids.items():
        if tuple(ids) in seen:
            raise UsageError(f"tasks {seen[tuple(ids)]!r} and {name!r} have prefixes that tokenize identically")
        seen[tuple(ids)] = name
    default_task = options.mote_default_task
    if default_task is None and not options.strict_routing:
        logger.warning("no default task: inputs without a task or prefix will be an error (see --default-task)")
    config = make_config(
        MoteBertConfig,
        **dense.fields,
        tasks=list(tasks),
        task_prefixes=tasks,
        task_prefix_ids=prefix_ids,
        task_prefix_start=leading_special_tokens(tokenizer),
        prefix_routes_only=options.prefix_routes_only,
        default_task=default_task,
        expert_layers=options.expert_layers,
    )
    model = fill_model(MoteBertModel, config, dense.state, mote_rename(set(config.expert_layers), config.num_tasks))
    return Upcycled(model=model, prompts=sentence_transformers_prompts(tasks))


def routed_config(config_cls, options: MoeOptions | CoMoeOptions, dense: DenseCheckpoint, **fields):
    """The config of a top-k routed model (token MoE, CoMoE): the dense encoder's fields, the options both
    architectures have (experts, top-k, load-balancing weight; each with its own default), and `fields`."""
    return make_config(
        config_cls,
        **dense.fields,
        num_local_experts=options.num_local_experts,
        num_experts_per_tok=options.num_experts_per_tok,
        router_aux_loss_coef=options.router_aux_loss_coef,
        **fields,
    )


def build_moe(options: MoeOptions, dense: DenseCheckpoint, tokenizer) -> Upcycled:
    """Token-routed sparse MoE (Nomic Embed v2): every MoE layer's FFN copied into each expert."""
    config = routed_config(
        MoeBertConfig,
        options,
        dense,
        moe_layers=options.moe_layers,
        norm_topk_prob=options.norm_topk_prob,
        router_z_loss_coef=options.router_z_loss_coef,
        router_jitter_noise=options.router_jitter_noise,
    )
    generator = torch.Generator().manual_seed(options.seed)
    keys = [moe_router_key(layer) for layer in config.moe_layers]
    routers = initial_tensors(MoeBertModel, config, keys, options.seed)
    if options.router_init == "zeros":
        routers = {key: torch.zeros_like(tensor) for key, tensor in routers.items()}
    rename = moe_rename(
        set(config.moe_layers), config.num_local_experts, options.expert_noise, generator, gated=config.gated_mlp
    )
    model = fill_model(MoeBertModel, config, dense.state, rename, new_tensors=routers)
    return Upcycled(
        model=model,
        prompts=sentence_transformers_prompts(options.tasks),
        exact=config.norm_topk_prob and options.expert_noise == 0,
    )


def build_comoe(options: CoMoeOptions, dense: DenseCheckpoint, tokenizer) -> Upcycled:
    """CoMoE-PEFT: the dense weights unchanged (frozen), LoRA experts with B = 0 and routers added."""
    config = routed_config(
        CoMoeBertConfig,
        options,
        dense,
        lora_rank=options.lora_rank,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.lora_dropout,
        target_modules=options.target_modules,
        adapter_layers=options.adapter_layers,
        contrastive_loss_coef=options.contrastive_loss_coef,
        contrastive_tau=options.contrastive_tau,
        base_model_name_or_path=base_name(options),
    )
    missing = [name for name in config.adapted_linears() if f"{name}.weight" not in dense.state]
    if missing:
        raise UsageError(f"the dense checkpoint has no {missing[0]}.weight to put LoRA experts on")
    keys = [key for name in config.adapted_linears() for key in comoe_adapter_keys(name).values()]
    adapters = initial_tensors(CoMoeBertModel, config, keys, options.seed)  # B = 0: the model starts as the base
    model = fill_model(CoMoeBertModel, config, dense.state, lambda key, tensor: [(key, tensor)], adapters)
    return Upcycled(model=model, prompts=sentence_transformers_prompts(options.tasks))


BUILDERS = {"mote": build_mote, "moe": build_moe, "comoe": build_comoe}


def base_name(options: UpcycleOptions) -> str:
    """How folders made from the base name it (a CoMoE adapter loads its base from this): the Hub id, for a
    Hub base and for the bundled MiniLM (its weights are that repository's); a local folder by its absolute path."""
    if options.base is None or is_bundled(options.base):
        return BUNDLED_MODEL_ID
    return str(Path(options.base).resolve()) if Path(options.base).is_dir() else options.base


def verify_against_dense(model, tokenizer, source: Path, prompts: dict[str, str], config=None) -> float:
    """Largest |difference| between the upcycled and the dense model's hidden states, over all prompts; the dense
    model is the checkpoint loaded by transformers into the base's own class, independent of this package's mapping
    (with `config`, the base's transformers config, where transformers misreads the folder's own: the Hub's
    NomicBERT configs, `Base.reference_config`).

    A MoTE model routes each batch by the prefix it starts with; one whose prefixes only route
    (`prefix_routes_only`) is compared, mean-pooled over the prompted text's mask, with the dense model on the
    text as it reads it: the row's ids without the prefix's (`without_prefix`).
    """
    from transformers import AutoModel

    given = {"config": config} if config is not None else {}
    dense = AutoModel.from_pretrained(str(source), dtype=torch.float32, **given).eval()
    texts = ["Isaac Newton formulated the laws of motion.", "a short text"]
    worst = 0.0
    with torch.no_grad():
        for prefix in prompts.values():
            batch = tokenizer([prefix + t for t in texts], padding=True, return_tensors="pt")
            mask = batch["attention_mask"].bool()
            if getattr(model.config, "prefix_routes_only", False):
                plain = without_prefix(model, tokenizer, batch)
                diff = mean_pooled(dense(**plain).last_hidden_state, plain) - mean_pooled(
                    model(**batch).last_hidden_state, batch
                )
            else:
                diff = (dense(**batch).last_hidden_state - model(**batch).last_hidden_state)[mask]
            worst = max(worst, diff.abs().max().item())
    return worst


def without_prefix(model, tokenizer, batch) -> dict:
    """`batch` with each row's task prefix tokens taken out (the leading special tokens kept): what a
    prefix-routed MoTE reads. With a WordPiece tokenizer this is the text alone; a byte-level BPE one (RoBERTa,
    ModernBERT) keeps the space after the prefix on the text's first word."""
    _, lengths = model.router.match(batch["input_ids"])
    start = model.config.task_prefix_start
    rows = []
    for ids, mask, length in zip(
        batch["input_ids"].tolist(), batch["attention_mask"].tolist(), lengths.tolist(), strict=True
    ):
        real = ids[: sum(mask)]
        rows.append(real[:start] + real[length:] if length else real)
    return tokenizer.pad({"input_ids": rows}, return_tensors="pt")


def mean_pooled(states: torch.Tensor, batch) -> torch.Tensor:
    mask = batch["attention_mask"].unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(1) / mask.sum(1)


def write_upcycled(options: UpcycleOptions, source: Path, output: Path) -> Path:
    """Build the upcycled model of the dense checkpoint in `source`, check it and write it to `output`."""
    logger.info("reading dense checkpoint %s", source)
    dense = read_dense_checkpoint(source)
    tokenizer = load_tokenizer(source)
    upcycled = BUILDERS[options.arch](options, dense, tokenizer)
    if not options.verify:
        logger.info("not checking against the dense model (--no-verify)")
    elif not upcycled.exact:
        logger.info(
            "not checking against the dense model: without --norm-topk-prob, or with expert noise, "
            "the upcycled model is not meant to reproduce it"
        )
    else:
        reference = base_of(dense.config.model_type).reference_config(dense.config)
        worst = verify_against_dense(upcycled.model, tokenizer, source, upcycled.prompts, reference)
        logger.info("max |upcycled - dense| over all prompts: %.2e", worst)
        if worst > DENSE_TOLERANCE:
            raise UsageError(f"upcycled model differs from the dense model by {worst:.2e} (> {DENSE_TOLERANCE:g})")
    model = upcycled.model.to(parse_dtype(options.dtype))
    bundled = options.base is None or is_bundled(options.base)
    with atomic_output_dir(output, options.overwrite) as tmp:
        model.config.requirements = dict(REQUIREMENTS)  # not a field: saved as it is, kept by later saves
        model_type = model.config.model_type
        write_model_folder(
            tmp,
            model=model,
            max_shard_size=options.max_shard_size,
            code=model_type,
            tokenizer_from=source,
            input_module=ST_MODULES[model_type],
            modules_from=source,
            prompts=upcycled.prompts,
            card=partial(
                render_card,
                repo_id=options.repo_id or f"{PLACEHOLDER_OWNER}/{output.name}",
                base_model=BUNDLED_MODEL_ID if bundled else options.base,
                base_is_hub_id=bundled or not Path(options.base).is_dir(),
                license_id=source_license(source),
                untrained=True,
            ),
        )
    print(f"wrote {output} ({options.arch}, {options.dtype})")
    return output


__all__ = ["BUILDERS", "Upcycled", "write_upcycled", "verify_against_dense"]
