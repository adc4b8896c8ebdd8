"""Expert usage of a token-routed model per task of the suite (CoMoE paper Figures 4 and 5).

    python -m moe_embed.evaluation.expert_usage models/comoe-minilm --tasks STSBenchmark,Banking77Classification \\
        --output usage.json --plot usage.png

For each task, up to `--max-texts` of its evaluation texts (drawn with `--seed`; retrieval: queries and
documents in equal parts) go through the model, each with the prompt mteb's evaluation gives it (mteb's own
lookup: task name and prompt type, task name, task type and prompt type, task type, prompt type; else the
model's default prompt), and per layer it reports

- the **share of routing slots** each expert received: every non-padding token sends `k` slots at
  each routed site (a CoMoE linear, or a MoE layer's FFN), counted over the sites of the layer,
  so a layer's shares sum to 100 %;
- the **mean pairwise cosine between expert outputs**: every expert's output for every non-padding
  token at each routed site, the cosine of each pair of experts, averaged over pairs, tokens and the
  layer's sites. High means the experts compute similar things. For an upcycled CoMoE (`B = 0`) the
  outputs are zero and the cosine is undefined (shown as —).

Works on CoMoE-PEFT (`comoe_bert`: sites are the adapted linears) and token-routed MoE (`moe_bert`:
sites are the MoE layers' FFN blocks) folders. Prints one markdown table per task; `--output` writes
the numbers as JSON, `--plot` a figure (needs matplotlib, the `analysis` extra).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.run import load_tasks, select_tasks
from moe_embed.folders import load_sentence_transformer
from moe_embed.options import option, parse_options
from moe_embed.readers import corpus_texts

ROUTED_MODEL_TYPES = ("comoe_bert", "moe_bert")


@dataclass
class Site:
    """A place where tokens are routed: its layer, its module, and every expert's output for given inputs."""

    layer: int
    name: str
    module: object
    all_outputs: object  # (tokens, in) -> (tokens, E, out)


def routed_sites(model) -> list[Site]:
    """The routed sites of a CoMoE or MoE transformer, in the order of its `router_logits` output."""
    import torch

    config = model.config
    if config.model_type == "comoe_bert":
        sites = []
        for name in config.adapted_linears():
            linear = model.get_submodule(name)
            layer = int(name.split(".")[2])
            sites.append(Site(layer, name, linear, lambda x, m=linear: m.expert_outputs(m.expert_codes(x))))
        return sites
    if config.model_type == "moe_bert":

        def moe_outputs(x, block):
            ones = torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)
            index = [
                torch.full((x.shape[0], 1), e, dtype=torch.long, device=x.device)
                for e in range(block.experts.num_experts)
            ]
            return torch.stack([block.experts(x, i, ones) for i in index], dim=1)

        return [
            Site(layer, f"encoder.layer.{layer}.mlp", block, lambda x, b=block: moe_outputs(x, b))
            for layer in config.moe_layers
            for block in [model.get_submodule(f"encoder.layer.{layer}.mlp")]
        ]
    raise UsageError(
        f"expected a token-routed model (model_type {' or '.join(ROUTED_MODEL_TYPES)}), got {config.model_type!r}"
    )


def mean_pairwise_cosine(outputs):
    """`(sum over tokens of the mean cosine over expert pairs, number of tokens)` for `(tokens, E, out)`;
    tokens where some expert's output is zero (cosine undefined) are left out."""
    import torch

    from moe_embed.modeling.comoe_layer import cosine_from_gram

    outputs = outputs.float()
    defined = outputs.norm(dim=-1).gt(0).all(dim=1)
    cosines = cosine_from_gram(outputs[defined] @ outputs[defined].transpose(1, 2))  # (tokens, E, E)
    pairs = torch.triu_indices(outputs.shape[1], outputs.shape[1], offset=1)
    return cosines[:, pairs[0], pairs[1]].mean(dim=1).sum().item(), int(defined.sum())


# the columns of mteb's task data that hold the texts to embed (a value may be a list of texts: clustering)
TEXT_COLUMNS = ("text", "sentence", "sentence1", "sentence2", "sentences")


def mteb_prompt(model, metadata, prompt_type=None) -> str:
    """The prompt mteb's Sentence-Transformers wrapper gives the texts of the task of `metadata` (of `prompt_type`,
    mteb's `PromptType`, or None) when it evaluates the SentenceTransformer `model`: mteb's own lookup over the
    prompt names it accepts, else what `encode` adds without a prompt (the model's default prompt)."""
    from mteb.models.abs_encoder import AbsEncoder, get_prompt

    accepted, _ = AbsEncoder.validate_task_to_prompt_name(model.prompts or None, raise_for_invalid_keys=False)
    prompt = get_prompt(accepted, metadata, prompt_type)
    if prompt is None and model.default_prompt_name is not None:
        prompt = model.prompts.get(model.default_prompt_name)
    return prompt or ""


def task_texts(task, model, max_texts: int, seed: int) -> list[str]:
    """Up to `max_texts` of the loaded mteb `task`'s evaluation texts, with the prompts mteb gives them."""
    from mteb.types import PromptType

    split = task.metadata.eval_splits[0]
    data = task.dataset[split] if split in task.dataset else task.dataset[next(iter(task.dataset))][split]
    rng = random.Random(seed)
    if isinstance(data, dict):  # retrieval: queries and documents, each half of the draw
        queries = list(data["queries"]["text"])
        documents = corpus_texts(data["corpus"])
        half = max_texts // 2
        query, document = (mteb_prompt(model, task.metadata, kind) for kind in (PromptType.query, PromptType.document))
        return [query + t for t in rng.sample(queries, min(half, len(queries)))] + [
            document + t for t in rng.sample(documents, min(max_texts - half, len(documents)))
        ]
    # an asymmetric pair task (STS, pair classification) names each side's prompt type; the others have none
    kinds = {
        "sentence1": getattr(task, "input1_prompt_type", None),
        "sentence2": getattr(task, "input2_prompt_type", None),
    }
    prompts = {column: mteb_prompt(model, task.metadata, kinds.get(column)) for column in TEXT_COLUMNS}
    texts = [
        prompts[column] + text
        for column in TEXT_COLUMNS
        if column in data.column_names
        for value in data[column]
        for text in (value if isinstance(value, list) else [value])
    ]
    return rng.sample(texts, min(max_texts, len(texts)))


def expert_usage(model, texts: list[str], batch_size: int = 32) -> list[dict]:
    """Per layer with routed sites: `{"layer", "shares" (per expert, summing to 1), "cosine" (or None),
    "tokens"}` for `texts` (already prompted) through the SentenceTransformer `model`."""
    import torch

    transformer = model[0].auto_model
    config = transformer.config
    sites = routed_sites(transformer)
    num_experts, top_k = config.num_local_experts, config.num_experts_per_tok
    counts = torch.zeros(len(sites), num_experts, dtype=torch.long)
    cosine_sum, cosine_tokens = [0.0] * len(sites), [0] * len(sites)
    captured: dict[int, torch.Tensor] = {}

    def capture(index):
        return lambda module, args: captured.__setitem__(index, args[0])

    hooks = [site.module.register_forward_pre_hook(capture(i)) for i, site in enumerate(sites)]
    transformer.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(texts), batch_size):
                features = model.preprocess(texts[start : start + batch_size])
                mask = features["attention_mask"].bool()
                out = transformer(
                    input_ids=features["input_ids"],
                    attention_mask=features["attention_mask"],
                    output_router_logits=True,
                )
                for i, (site, logits) in enumerate(zip(sites, out.router_logits, strict=True)):
                    chosen = torch.topk(logits, top_k, dim=-1).indices  # the softmax keeps the order
                    counts[i] += torch.bincount(chosen.reshape(-1), minlength=num_experts)
                    inputs = captured.pop(i)
                    if inputs.dim() == 3:  # a CoMoE linear sees the padded batch: keep the real tokens
                        inputs = inputs[mask]
                    total, tokens = mean_pairwise_cosine(site.all_outputs(inputs))
                    cosine_sum[i] += total
                    cosine_tokens[i] += tokens
    finally:
        for hook in hooks:
            hook.remove()
    layers = []
    for layer in dict.fromkeys(site.layer for site in sites):
        members = [i for i, site in enumerate(sites) if site.layer == layer]
        layer_counts = counts[members].sum(dim=0)
        tokens = sum(cosine_tokens[i] for i in members)
        layers.append(
            {
                "layer": layer,
                "shares": (layer_counts / layer_counts.sum().clamp(min=1)).tolist(),
                "cosine": sum(cosine_sum[i] for i in members) / tokens if tokens else None,
                "tokens": int(layer_counts.sum()) // (top_k * len(members)),
            }
        )
    return layers


def table(layers: list[dict]) -> str:
    """Markdown: a row per layer, each expert's share in %, the mean pairwise cosine."""
    num_experts = len(layers[0]["shares"])
    lines = [
        "| layer | " + " | ".join(f"expert {e}" for e in range(num_experts)) + " | expert cosine |",
        "|---:|" + "---:|" * (num_experts + 1),
    ]
    for row in layers:
        cosine = "—" if row["cosine"] is None else f"{row['cosine']:.3f}"
        lines.append(f"| {row['layer']} | " + " | ".join(f"{100 * s:.1f} %" for s in row["shares"]) + f" | {cosine} |")
    return "\n".join(lines)


def plot(usage: dict[str, list[dict]], path: Path, title: str) -> None:
    """One panel per task (stacked bars: each layer's expert shares) and one of the cosines per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(usage)
    columns = min(len(tasks) + 1, 4)
    rows = -(-(len(tasks) + 1) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.9 * rows), squeeze=False)
    axes = axes.ravel()
    for axis, task in zip(axes, tasks, strict=False):
        layers = [row["layer"] for row in usage[task]]
        bottom = [0.0] * len(layers)
        for expert in range(len(usage[task][0]["shares"])):
            shares = [100 * row["shares"][expert] for row in usage[task]]
            axis.bar(layers, shares, bottom=bottom, label=f"expert {expert}")
            bottom = [b + s for b, s in zip(bottom, shares, strict=True)]
        axis.set_title(task, fontsize=9)
        axis.set_xticks(layers)
        axis.set_xlabel("layer")
        axis.set_ylabel("routing share (%)")
        axis.set_ylim(0, 100)
    cosine_axis = axes[len(tasks)]
    for task in tasks:
        points = [(row["layer"], row["cosine"]) for row in usage[task] if row["cosine"] is not None]
        if points:
            cosine_axis.plot(*zip(*points, strict=True), marker="o", label=task)
    cosine_axis.set_title("mean pairwise cosine of expert outputs", fontsize=9)
    cosine_axis.set_xlabel("layer")
    if cosine_axis.get_lines():
        cosine_axis.legend(fontsize=6)
    else:
        cosine_axis.text(0.5, 0.5, "undefined: every expert output is zero", ha="center", fontsize=8)
    axes[0].legend(fontsize=7)
    for axis in axes[len(tasks) + 1 :]:
        axis.axis("off")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


@dataclass
class ExpertUsageOptions:
    """`moe-embed expert-usage`'s options (its `--help` is generated from the fields)."""

    model: str = option(required=True, positional=True, help="CoMoE-PEFT or token-routed MoE folder (or Hub id)")
    tasks: str = option("all", help="comma-separated moe_embed.evaluation.run task names, or 'all'")
    max_texts: int = option(256, help="texts per task (default 256)")
    seed: int = option(0, help="seed of the text draw (default 0)")
    batch_size: int = option(32, help="texts per forward pass (default: %(default)s)")
    data_dir: str | None = option(help=DATA_DIR_HELP)
    output: str | None = option(help="JSON file for the numbers")
    plot: str | None = option(help="image file for the figure (needs matplotlib)")

    def __post_init__(self):
        if self.max_texts < 1 or self.batch_size < 1:
            raise UsageError("--max-texts and --batch-size must be positive integers")


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    args = parse_options(ExpertUsageOptions, argv, __doc__, prog)
    names = select_tasks(args.tasks)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install -e '.[analysis]'") from None

    tasks = load_tasks(names, args.data_dir)  # every dataset read before the model
    model = load_sentence_transformer(args.model, trust_remote_code=True)  # it reads this package's routers
    routed_sites(model[0].auto_model)  # a clear error before any text is embedded
    usage = {}
    for name, task in tasks.items():
        usage[name] = expert_usage(model, task_texts(task, model, args.max_texts, args.seed), args.batch_size)
        print(f"\n{name}\n\n{table(usage[name])}", flush=True)
    if args.output:
        Path(args.output).write_text(json.dumps(usage, indent=2) + "\n")
    if args.plot:
        plot(usage, Path(args.plot), Path(args.model).name)
    return usage


if __name__ == "__main__":
    run_cli(main)
