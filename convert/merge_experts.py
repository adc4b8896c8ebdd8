"""Merge the experts of a MoTE, token-routed MoE or CoMoE folder into a plain dense transformers model.

    python convert/merge_experts.py models/mote-minilm --output models/minilm-ea              # Expert Averaging
    python convert/merge_experts.py models/mote-minilm --task query --output models/minilm-query
    python convert/merge_experts.py models/mote-minilm --experts clustering,document --output models/minilm-cd
    python convert/merge_experts.py models/moe-minilm --calibration texts.txt --output models/minilm-moe-ea
    python convert/merge_experts.py models/comoe-tacl --calibration texts.txt --output models/minilm-comoe-merged

Expert Averaging (MoTE paper, v1 section 3.3): every expert layer's experts are averaged, the two
LayerNorms included, into one feed-forward block, giving a model with the dense architecture and
memory. `--task` exports one task's experts unchanged: a MoTE model used for one task is a dense
model. A CoMoE folder (full or adapter-only) has its LoRA experts folded into the frozen linears,
`W + Σ_i w_i · (alpha / r) · B_i A_i`, with `w_i` each expert's mean routing weight on the
calibration texts (uniform without them); routing depends on the input, so this approximates the
CoMoE model, and the mean cosine between both models' embeddings of the calibration texts is
printed. The output is a `bert` / `roberta` / `xlm-roberta` folder (like the checkpoint the model
was upcycled from) with the Sentence-Transformers files and prompts, loadable without remote code.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python convert/merge_experts.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from tqdm.auto import tqdm

from convert.cards import PLACEHOLDER_OWNER, render_card, source_license
from convert.checkpoint import (
    ENCODER_FIELDS,
    atomic_output_dir,
    check_shard_size,
    copy_tokenizer_files,
    load_tokenizer,
    parse_dtype,
    read_json,
    read_state_dict,
    refuse_overlap,
    write_sentence_transformers_files,
)
from convert.layout import DENSE_ARCHITECTURES, parse_moe_key, parse_mote_key, position_offset
from moe_embed_cli import UsageError, run_cli

logger = logging.getLogger("merge_experts")


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
    from modeling.configuration_mote import MoteBertConfig

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
    for target, by_expert in tqdm(groups.items(), desc="averaging", unit="tensor"):
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
    for key, tensor in tqdm(state.items(), desc="averaging", unit="tensor"):
        parsed = parse_moe_key(key)
        if parsed is None:
            merged[key] = tensor
        elif parsed[1] is not None:  # stacked expert parameter (E, ...); routers have no dense counterpart
            layer, dense_key = parsed
            merged[dense_key] = weighted_average([tensor[e] for e in experts], layer_weights[layer])
    return merged


def router_usage(folder: Path, texts: list[str], experts: list[int], batch_size: int = 32) -> dict[int, list[float]]:
    """Per MoE layer, the share of routing slots each selected expert receives on the calibration texts."""
    from modeling.modeling_moe import MoeBertModel

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


def read_calibration(calibration: Path) -> list[str]:
    """The calibration texts, one per line."""
    try:
        texts = [line.strip() for line in calibration.read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as error:
        raise UsageError(f"cannot read --calibration {calibration}: {error.strerror}") from None
    if not texts:
        raise UsageError(f"--calibration {calibration} holds no text (one text per line expected)")
    return texts


def comoe_routing_weights(model, tokenizer, texts: list[str], batch_size: int = 32) -> torch.Tensor:
    """`(CoMoE linears, E)`: each expert's mean routing weight over the non-padding tokens of `texts`."""
    from modeling.modeling_comoe import top_k_gates

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


def merge_comoe(model, weights: torch.Tensor) -> dict:
    """Dense BERT state dict: every CoMoE linear's weight plus `Σ_i weights[l, i] · (alpha/r) · B_i A_i`
    (float64), routers and experts dropped."""
    from modeling.modeling_comoe import is_adapter_key

    state = {k: v for k, v in model.state_dict().items() if not is_adapter_key(k)}
    scaling = model.config.lora_scaling
    for row, name in enumerate(model.config.adapted_linears()):
        linear = model.get_submodule(name)
        delta = torch.einsum("e,eor,eri->oi", weights[row].double(), linear.lora_B.double(), linear.lora_A.double())
        state[f"{name}.weight"] = (linear.weight.double() + scaling * delta).to(linear.weight.dtype)
    return state


def mean_cosine(folder: Path, merged: Path, texts: list[str]) -> float:
    """Mean cosine between the embeddings of `texts` by the expert folder and by the merged folder."""
    from sentence_transformers import SentenceTransformer

    original = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    dense = SentenceTransformer(str(merged), device="cpu")
    a = original.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    b = dense.encode(texts, convert_to_tensor=True, normalize_embeddings=True)
    return (a * b).sum(dim=1).mean().item()


def dense_config(config: dict) -> transformers.PretrainedConfig:  # noqa: F821
    """The transformers config of the dense model with the same encoder shape."""
    from transformers import AutoConfig

    model_type = config.get("source_model_type") or "bert"
    if model_type not in DENSE_ARCHITECTURES:
        raise UsageError(f"cannot export to model_type {model_type!r}; expected one of {list(DENSE_ARCHITECTURES)}")
    expected_offset = position_offset(model_type, config.get("pad_token_id", 1))
    if config.get("position_offset", 0) != expected_offset:
        raise UsageError(
            f"position_offset {config.get('position_offset')} does not match a {model_type} checkpoint "
            f"({expected_offset})"
        )
    fields = {key: config[key] for key in ENCODER_FIELDS if key in config}
    dense = AutoConfig.for_model(model_type, **fields, architectures=[DENSE_ARCHITECTURES[model_type]])
    if config.get("dtype"):
        dense.dtype = config["dtype"]
    return dense


def merge(args) -> Path:
    """Write the dense folder `args` describes; returns its path."""
    from transformers import AutoModel

    folder = Path(args.model_dir)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} is not a model folder (no config.json)")
    config = read_json(folder / "config.json")
    model_type = config.get("model_type")
    if model_type not in ("mote_bert", "moe_bert", "comoe_bert"):
        raise UsageError(
            f"{folder} holds model_type={model_type!r}; expected a MoTE (mote_bert), token-routed MoE "
            "(moe_bert) or CoMoE (comoe_bert) folder"
        )
    output = Path(args.output)
    refuse_overlap(folder, output)
    if output.exists() and not args.overwrite:
        raise UsageError(f"{output.resolve()} already exists; pass --overwrite to replace it")
    if args.task and args.experts:
        raise UsageError("pass --task or --experts, not both")
    if args.calibration and args.weights:
        raise UsageError("pass --calibration or --weights, not both")
    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    names = [args.task] if args.task else (args.experts.split(",") if args.experts else None)
    st_config = read_json(folder / "config_sentence_transformers.json")
    st_prompts = st_config.get("prompts", {})
    default_prompt = st_config.get("default_prompt_name")  # a merge keeps the plain `encode` prompt

    calibration_texts = (
        read_calibration(Path(args.calibration)) if args.calibration and model_type != "mote_bert" else None
    )
    if model_type == "comoe_bert":
        from modeling.modeling_comoe import CoMoeBertModel

        if args.task or args.experts:
            raise UsageError("--task and --experts do not apply to CoMoE: every expert is folded in, weighted")
        comoe = CoMoeBertModel.from_pretrained(str(folder)).eval()  # full or adapter-only folder
        num_experts = comoe.config.num_local_experts
        if calibration_texts:
            shares = comoe_routing_weights(comoe, load_tokenizer(folder, trust_remote_code=True), calibration_texts)
        else:
            uniform = torch.tensor(normalised_weights(num_experts, weights), dtype=torch.float64)
            shares = uniform.expand(len(comoe.config.adapted_linears()), -1)
        logger.info("expert weights per CoMoE linear (mean over linears): %s", shares.mean(0).tolist())
        merged = merge_comoe(comoe, shares)
        provenance = (
            "The CoMoE LoRA experts folded into the base weights, each weighted by its "
            + ("mean routing weight on calibration texts" if calibration_texts else "share given (uniform by default)")
            + ". Routing depends on the input, so this dense model approximates the CoMoE model."
        )
    else:
        state = read_state_dict(folder)
    if model_type == "mote_bert":
        if args.calibration:
            raise UsageError("--calibration weights experts by router usage; MoTE routes by task, use --weights")
        experts = mote_expert_indices(config, names)
        merged = merge_mote(state, config, experts, normalised_weights(len(experts), weights))
        chosen = [config["tasks"][e] for e in experts]
        if args.task:
            task = chosen[0]
            prefix = config["task_prefixes"][task]
            default_prompt = (
                task
                if st_prompts.get(task) == prefix
                else next((name for name, text in st_prompts.items() if text == prefix), None)
            )
            if default_prompt is None:
                default_prompt = task
                st_prompts = {**st_prompts, task: prefix}
            provenance = (
                f"It holds the `{task}` task experts of the MoTE model, unchanged; `encode` prepends `{prefix}`."
            )
        else:
            shares = ", ".join(f"{w:.3g}" for w in normalised_weights(len(experts), weights))
            provenance = f"Expert Averaging of the task experts {chosen} ({shares})."
    elif model_type == "moe_bert":
        if args.task:
            raise UsageError("--task applies to MoTE folders; a token-routed MoE has no task experts")
        num_experts = config["num_local_experts"]
        try:
            experts = [int(e) for e in names] if names else list(range(num_experts))
        except ValueError:
            raise UsageError(f"--experts for a token-routed MoE takes expert indices 0..{num_experts - 1}") from None
        if any(not 0 <= e < num_experts for e in experts) or len(set(experts)) != len(experts):
            raise UsageError(f"--experts must be distinct indices in 0..{num_experts - 1}, got {experts}")
        if calibration_texts:
            layer_weights = router_usage(folder, calibration_texts, experts)
        else:
            uniform = normalised_weights(len(experts), weights)
            layer_weights = {layer: uniform for layer in config["moe_layers"]}
        merged = merge_moe(state, experts, layer_weights)
        provenance = f"Expert Averaging of experts {experts} of every MoE layer" + (
            " weighted by router usage on a calibration text." if args.calibration else "."
        )

    target_config = dense_config(config)
    with torch.device("meta"):
        model = AutoModel.from_config(target_config, add_pooling_layer=config.get("add_pooling_layer", True))
    try:
        model.load_state_dict(merged, strict=True, assign=True)
    except RuntimeError as error:
        raise UsageError(f"merged weights do not fit {type(model).__name__}: {str(error).splitlines()[0]}") from None
    model = model.to(parse_dtype(args.dtype) if args.dtype else next(iter(merged.values())).dtype).eval()

    base_model = None
    try:
        from huggingface_hub import ModelCard

        base_model = ModelCard.load(folder / "README.md").data.base_model
    except Exception:  # no card: the base model is unknown
        pass
    with atomic_output_dir(output, args.overwrite) as tmp:
        model.save_pretrained(tmp, max_shard_size=args.max_shard_size)
        copy_tokenizer_files(folder, tmp)
        write_sentence_transformers_files(
            folder,
            tmp,
            "sentence_transformers.models.Transformer",
            st_prompts,
            default_prompt_name=default_prompt,
            drop_module_keys=("prepend_task_prefix",),
        )
        render_card(
            tmp,
            args.repo_id or f"{PLACEHOLDER_OWNER}/{output.name}",
            base_model=base_model,
            license_id=source_license(folder),
            provenance=provenance,
        )
    logger.info("wrote %s (%s)", output, provenance)
    if config.get("model_type") == "comoe_bert":
        if calibration_texts:
            cosine = mean_cosine(folder, output, calibration_texts[:512])
            print(f"mean cosine between the CoMoE and the merged embeddings on the calibration texts: {cosine:.4f}")
        else:
            print("no --calibration texts: the merged model's agreement with the CoMoE model was not measured")
    return output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Merge the experts of a MoTE or token-routed MoE folder into a plain dense transformers model.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("model_dir", help="MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--task", default=None, help="MoTE: export this task's experts (its prompt becomes the default)"
    )
    parser.add_argument(
        "--experts",
        default=None,
        help="average only these experts: MoTE task names (e.g. clustering,document) or MoE indices (e.g. 0,3)",
    )
    parser.add_argument("--weights", default=None, help="comma-separated weights of the averaged experts (normalised)")
    parser.add_argument(
        "--calibration",
        default=None,
        help="MoE / CoMoE: text file, one text per line; weight each layer's experts by their router usage on it",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        choices=["float32", "float16", "bfloat16"],
        help="dtype of the saved weights (default: that of the input)",
    )
    parser.add_argument(
        "--max-shard-size",
        default="2GB",
        type=check_shard_size,
        help="safetensors shard size above which weights are split",
    )
    parser.add_argument("--repo-id", default=None, help="Hub id shown in the model card's usage snippets")
    return parser


def main(argv: list[str] | None = None) -> None:
    merge(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_cli(main)
