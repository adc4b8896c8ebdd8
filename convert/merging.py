"""Expert merging: what `moe-embed merge` (`convert/merge_experts.py`) runs. Per model type a merger turns
the expert folder into a dense state dict, the prompts the dense folder keeps and the card's provenance
and tags; `write_merged` loads the state into transformers' own `BertModel` / `RobertaModel` /
`XLMRobertaModel` (strict: every key and shape checked) and writes the folder atomically.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from tqdm.auto import tqdm

from moe_embed.convert.bases import architecture, base_of, dense_fields, encoder_fields
from moe_embed.convert.cards import PLACEHOLDER_OWNER, render_card, source_license
from moe_embed.convert.checkpoint import load_tokenizer, parse_dtype, read_state_dict
from moe_embed.convert.folder_writer import write_model_folder
from moe_embed.convert.layout import parse_moe_key, parse_mote_key
from moe_embed.errors import UsageError
from moe_embed.files import atomic_output_dir, read_json
from moe_embed.folders import ModelFolder
from moe_embed.modeling.defaults import prompt_key
from moe_embed.modeling.manifest import FAMILY_TAGS, MERGE_TAGS
from moe_embed.readers import read_texts

if TYPE_CHECKING:
    from moe_embed.convert.options import MergeOptions

logger = logging.getLogger(__name__)


def weighted_average(tensors: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """`Σ w_i t_i` for weights summing to 1, computed as `t_0 + Σ w_i (t_i - t_0)` in float64.

    Algebraically the same, but identical experts give back `t_0` bit for bit (an untrained
    upcycled model averages to its dense source exactly).
    """
    base = tensors[0].double()
    total = base.clone()
    for tensor, weight in zip(tensors[1:], weights[1:], strict=True):
        total += weight * (tensor.double() - base)
    return total.to(tensors[0].dtype)


def normalised_weights(count: int, weights: list[float] | None) -> list[float]:
    """`weights` (positive, one per selected expert) scaled to sum to 1; uniform when `None`."""
    if weights is None:
        return [1.0 / count] * count
    if len(weights) != count:
        raise UsageError(f"--weights has {len(weights)} values for {count} experts")
    if any(w < 0 for w in weights) or sum(weights) <= 0:
        raise UsageError(f"--weights must be non-negative with a positive sum, got {weights}")
    return [w / sum(weights) for w in weights]


def mote_expert_indices(config: dict, names: list[str] | None) -> list[int]:
    """Indices of the MoTE experts named (task names or aliases, as `MoteBertConfig.task_index`
    resolves them); all tasks when `names` is None."""
    from moe_embed.modeling.configuration_mote import MoteBertConfig

    mote_config = MoteBertConfig.from_dict(config)
    if names is None:
        return list(range(mote_config.num_tasks))
    try:
        indices = [mote_config.task_index(name) for name in names]
    except ValueError as error:
        raise UsageError(str(error)) from None
    if len(set(indices)) != len(indices):
        raise UsageError(f"--experts names a task twice: {names}")
    return indices


def merge_mote(state: dict, config: dict, experts: list[int], weights: list[float]) -> dict:
    """Dense BERT state dict: each expert layer's selected experts averaged with `weights`."""
    merged, groups = {}, {}
    for key, tensor in state.items():
        parsed = parse_mote_key(key)
        if parsed is None:
            merged[key] = tensor
            continue
        _, expert, dense_key = parsed
        groups.setdefault(dense_key, {})[expert] = tensor
    for target, by_expert in groups.items():
        missing = [e for e in experts if e not in by_expert]
        if missing:
            raise UsageError(
                f"the folder lacks experts {[config['tasks'][e] for e in missing]} for {target} "
                "(saved with active_tasks?)"
            )
        merged[target] = weighted_average([by_expert[e] for e in experts], weights)
    return merged


def merge_moe(state: dict, experts: list[int], layer_weights: dict[int, list[float]]) -> dict:
    """Dense BERT state dict: each MoE layer's stacked experts averaged; routers dropped."""
    merged = {}
    for key, tensor in state.items():
        parsed = parse_moe_key(key)
        if parsed is None:
            merged[key] = tensor
        elif parsed[1] is not None:  # stacked expert parameter (E, ...); routers have no dense counterpart
            layer, dense_key = parsed
            merged[dense_key] = weighted_average([tensor[e] for e in experts], layer_weights[layer])
    return merged


def router_usage(folder: Path, texts: list[str], experts: list[int], batch_size: int = 32) -> dict[int, list[float]]:
    """Per MoE layer, the share of routing slots each selected expert receives on the calibration texts."""
    from moe_embed.modeling.modeling_moe import MoeBertModel

    tokenizer = load_tokenizer(folder, trust_remote_code=True)
    model = MoeBertModel.from_pretrained(str(folder), experts_implementation="eager").eval()
    counts = {layer: torch.zeros(model.config.num_local_experts) for layer in model.config.moe_layers}
    with torch.no_grad():
        for start in tqdm(range(0, len(texts), batch_size), desc="calibration", unit="batch"):
            batch = tokenizer(texts[start : start + batch_size], padding=True, truncation=True, return_tensors="pt")
            out = model(**batch, output_router_logits=True)
            for layer, logits in zip(model.config.moe_layers, out.router_logits, strict=True):
                chosen = torch.topk(logits, model.config.num_experts_per_tok, dim=-1).indices.reshape(-1)
                counts[layer] += torch.bincount(chosen, minlength=model.config.num_local_experts).float()
    usage = {}
    for layer, count in counts.items():
        selected = count[experts]
        if selected.sum() == 0:
            raise UsageError(f"no calibration token was routed to experts {experts} in layer {layer}")
        usage[layer] = (selected / selected.sum()).tolist()
        logger.info("layer %d router usage of experts %s: %s", layer, experts, [round(u, 3) for u in usage[layer]])
    return usage


def comoe_routing_weights(model, tokenizer, texts: list[str], batch_size: int = 32) -> torch.Tensor:
    """`(CoMoE linears, E)`: each expert's mean routing weight over the non-padding tokens of `texts`."""
    from moe_embed.modeling.comoe_layer import top_k_gates

    config = model.config
    totals = torch.zeros(len(config.adapted_linears()), config.num_local_experts, dtype=torch.float64)
    with torch.no_grad():
        for start in tqdm(range(0, len(texts), batch_size), desc="calibration", unit="batch"):
            batch = tokenizer(texts[start : start + batch_size], padding=True, truncation=True, return_tensors="pt")
            out = model(**batch, output_router_logits=True)
            for row, logits in enumerate(out.router_logits):
                weights, index = top_k_gates(logits, config.num_experts_per_tok)
                totals[row].index_add_(0, index.reshape(-1), weights.reshape(-1).double())
    return totals / totals.sum(dim=1, keepdim=True)


def mean_cosine(folder: Path, merged: Path, texts: list[str]) -> float:
    """Mean cosine between the embeddings of `texts` by the expert folder and by the merged folder."""
    from sentence_transformers import SentenceTransformer

    original = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    dense = SentenceTransformer(str(merged), device="cpu")
    a = original.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    b = dense.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    return (a * b).sum(dim=1).mean().item()


def dense_config(config: dict):
    """The transformers config of the dense model of the folder's base (`source_model_type`) with the same encoder.

    Raises:
        UsageError: where that config would not compute the folder's encoder: a field of the folder (its positions,
            norms, biases, ...) differs from what the base's config gives back (`convert/bases.py`).
    """
    from transformers import AutoConfig

    model_type, fields = dense_fields(config)
    dense = AutoConfig.for_model(model_type, **fields, architectures=[architecture(model_type)])
    defaults = {"position_offset": 0, "type_vocab_size": 2}  # the encoder config's, where an old folder has none
    for name, value in encoder_fields(dense).items():
        if config.get(name, defaults.get(name)) != value and name != "source_model_type":
            raise UsageError(
                f"{name}={config.get(name)!r} of the folder does not match a {model_type} checkpoint ({value!r})"
            )
    if config.get("dtype"):
        dense.dtype = config["dtype"]
    return dense


@dataclass
class Merged:
    """What a merger returns: the dense state dict, the prompts the dense folder keeps and its default, how
    it was merged (a key of `MERGE_TAGS`) and the card's provenance line."""

    state: dict
    prompts: dict[str, str]
    default_prompt: str | None
    kind: str
    provenance: str
    calibration_texts: list[str] | None = None  # CoMoE: texts to measure the merged model's agreement on


def mote_prompts(folder: ModelFolder, task: str | None) -> dict[str, str]:
    """The prompts of a dense folder merged from a MoTE folder. Its plain `encode(texts)` means what the MoTE
    folder's does, by the routing rule: nothing is added to the row, so the folder names no default prompt, and
    the prompts stay available by name (`prompt_name=`). Averaged experts keep every prompt; one task's experts
    keep only the prompts of that task's prefix (another task's prompt would silently run this task's experts)."""
    prompts = read_json(folder.path / "config_sentence_transformers.json").get("prompts") or {}
    if task is None:
        return prompts
    prefix = folder.config["task_prefixes"][task]
    return {name: text for name, text in prompts.items() if text == prefix} or {prompt_key(task): prefix}


def merge_mote_folder(folder: ModelFolder, options: MergeOptions) -> Merged:
    """MoTE: Expert Averaging of the selected task experts, or one task's experts unchanged (`task`)."""
    if options.calibration:
        raise UsageError("--calibration weights experts by router usage; MoTE routes by task, use --weights")
    config = folder.config
    experts = mote_expert_indices(config, options.selected)
    weights = normalised_weights(len(experts), options.weights)
    state = merge_mote(read_state_dict(folder.path), config, experts, weights)
    chosen = [config["tasks"][e] for e in experts]
    task = chosen[0] if options.task else None
    prompts = mote_prompts(folder, task)
    if task is None:
        shares = ", ".join(f"{w:.3g}" for w in weights)
        provenance = f"Expert Averaging of the task experts {chosen} ({shares})."
        return Merged(state, prompts, None, "average", provenance)
    provenance = (
        f"It holds the `{task}` task experts of the MoTE model, unchanged, and only that task's prompts "
        f"(`{config['task_prefixes'][task]}`)."
    )
    return Merged(state, prompts, None, "task", provenance)


def merge_moe_folder(folder: ModelFolder, options: MergeOptions) -> Merged:
    """Token-routed MoE: each MoE layer's experts averaged, uniformly, with `weights`, or by router usage."""
    if options.task:
        raise UsageError("--task applies to MoTE folders; a token-routed MoE has no task experts")
    num_experts = folder.config["num_local_experts"]
    names = options.selected
    try:
        experts = [int(e) for e in names] if names else list(range(num_experts))
    except ValueError:
        raise UsageError(f"--experts for a token-routed MoE takes expert indices 0..{num_experts - 1}") from None
    if any(not 0 <= e < num_experts for e in experts) or len(set(experts)) != len(experts):
        raise UsageError(f"--experts must be distinct indices in 0..{num_experts - 1}, got {experts}")
    if options.calibration:
        layer_weights = router_usage(folder.path, read_texts(Path(options.calibration), "--calibration"), experts)
    else:
        uniform = normalised_weights(len(experts), options.weights)
        layer_weights = {layer: uniform for layer in folder.config["moe_layers"]}
    state = merge_moe(read_state_dict(folder.path), experts, layer_weights)
    provenance = f"Expert Averaging of experts {experts} of every MoE layer" + (
        " weighted by router usage on a calibration text." if options.calibration else "."
    )
    st_config = read_json(folder.path / "config_sentence_transformers.json")
    return Merged(state, st_config.get("prompts", {}), st_config.get("default_prompt_name"), "average", provenance)


def merge_comoe_folder(folder: ModelFolder, options: MergeOptions) -> Merged:
    """CoMoE (full or adapter-only): every LoRA expert folded into its linear, weighted by its routing."""
    from moe_embed.modeling.modeling_comoe import CoMoeBertModel

    if options.task or options.experts:
        raise UsageError("--task and --experts do not apply to CoMoE: every expert is folded in, weighted")
    try:
        comoe = CoMoeBertModel.from_pretrained(str(folder.path)).eval()
    except ValueError as error:  # an adapter whose base does not fit it, or files that disagree
        raise UsageError(str(error).splitlines()[0]) from None
    texts = read_texts(Path(options.calibration), "--calibration") if options.calibration else None
    if texts:
        shares = comoe_routing_weights(comoe, load_tokenizer(folder.path, trust_remote_code=True), texts)
    else:
        uniform = normalised_weights(comoe.config.num_local_experts, options.weights)
        shares = torch.tensor(uniform, dtype=torch.float64).expand(len(comoe.config.adapted_linears()), -1)
    logger.info("expert weights per CoMoE linear (mean over linears): %s", shares.mean(0).tolist())
    provenance = (
        "The CoMoE LoRA experts folded into the base weights, each weighted by its "
        + ("mean routing weight on calibration texts" if texts else "share given (uniform by default)")
        + ". Routing depends on the input, so this dense model approximates the CoMoE model."
    )
    st_config = read_json(folder.path / "config_sentence_transformers.json")
    prompts, default = st_config.get("prompts", {}), st_config.get("default_prompt_name")
    return Merged(comoe.merged_state_dict(shares), prompts, default, "lora", provenance, calibration_texts=texts)


# model type -> merger (opened folder, options) -> Merged
MERGERS = {"mote_bert": merge_mote_folder, "moe_bert": merge_moe_folder, "comoe_bert": merge_comoe_folder}


def dense_model(config: dict, state: dict, dtype: torch.dtype | None) -> torch.nn.Module:
    """The transformers model of the source architecture holding the merged `state` (the shared encoder's names,
    renamed back to the base's: every key checked)."""
    from transformers import AutoModel

    base = base_of(config.get("source_model_type") or "bert", "the folder's source_model_type")
    pooler = {"add_pooling_layer": config.get("add_pooling_layer", True)} if base.pooler else {}
    with torch.device("meta"):
        model = AutoModel.from_config(dense_config(config), **pooler)
    try:
        model.load_state_dict(base.to_theirs(state), strict=True, assign=True)
    except RuntimeError as error:
        raise UsageError(f"merged weights do not fit {type(model).__name__}: {str(error).splitlines()[0]}") from None
    return model.to(dtype or next(iter(state.values())).dtype).eval()


def card_base_model(folder: Path) -> str | None:
    """The `base_model` the folder's card names, if any."""
    from huggingface_hub import ModelCard

    try:
        return ModelCard.load(folder / "README.md").data.base_model
    except Exception:  # no card or no metadata: the base model is unknown
        return None


def write_merged(folder: ModelFolder, output: Path, options: MergeOptions) -> Path:
    """Merge the opened expert `folder` as `options` say and write the dense folder to `output`."""
    merged = MERGERS[folder.model_type](folder, options)
    model = dense_model(folder.config, merged.state, parse_dtype(options.dtype) if options.dtype else None)
    with atomic_output_dir(output, options.overwrite) as tmp:
        write_model_folder(
            tmp,
            model=model,
            max_shard_size=options.max_shard_size,
            tokenizer_from=folder.path,
            input_module="sentence_transformers.models.Transformer",
            modules_from=folder.path,
            prompts=merged.prompts,
            default_prompt_name=merged.default_prompt,
            card=partial(
                render_card,
                repo_id=options.repo_id or f"{PLACEHOLDER_OWNER}/{output.name}",
                base_model=card_base_model(folder.path),
                license_id=source_license(folder.path),
                provenance=merged.provenance,
                tags=FAMILY_TAGS[folder.model_type][:1] + MERGE_TAGS[merged.kind],
            ),
        )
    print(f"wrote {output} ({merged.provenance})")
    if folder.model_type == "comoe_bert":
        if merged.calibration_texts:
            cosine = mean_cosine(folder.path, output, merged.calibration_texts[:512])
            print(f"mean cosine between the CoMoE and the merged embeddings on the calibration texts: {cosine:.4f}")
        else:
            print("no --calibration texts: the merged model's agreement with the CoMoE model was not measured")
    return output


__all__ = ["MERGERS", "Merged", "write_merged", "dense_config", "dense_model", "weighted_average"]
