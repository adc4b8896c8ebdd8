"""CoMoE-PEFT against LoRA and MoE-LoRA at this machine's scale.

    python -m experiments.comoe_vs_lora --output models/comoe-experiment --seeds 0,1,2

From the bundled all-MiniLM-L6-v2 with MoTE's four prompts (the MoTE experiment's `ic-base`), on
the MoTE experiment's data, steps and seeds (`experiments.prepare_data`, one epoch of TA-CL), with
the base frozen and the adapters on query, key, value and attention.output.dense of every layer,
it trains

- `lora-r16`: peft LoRA, r = 16, alpha 32;
- `lora-r66`: peft LoRA with as many trainable parameters as CoMoE (r = 66, alpha 132: the same
  alpha / r = 2);
- `moe-lora`: 4 LoRA experts of r = 16, top-2 routing per token, λ = 0;
- `comoe`: the same with the contrastive expert loss, λ = 0.01;

and, on `--sweep-seed` only, CoMoE with the other λ of `--sweep` (paper Figure 3; λ = 0 and 0.01
are `moe-lora` and `comoe`). The learning rate is the paper's 2e-4 for every variant. It then
evaluates every run and the untouched base on the suite (`moe-embed evaluate` on `OUTPUT/hubdata`, the
Hub-layout copies of `../shared/data`; SciFact left out by default: one SciFact evaluation costs more
than a training run here), writes the expert usage of
MoE-LoRA and CoMoE (`moe_embed.evaluation.expert_usage`) and a report: the scores split into in-domain tasks
(their train split is in the training data) and out-of-domain ones, trainable parameters, and
per-seed differences to `--reference` (default `lora-r16`). As in `experiments.mote_vs_ic`,
finished steps are skipped, and runs whose scores are in `OUTPUT/results/` are not retrained
(`experiments/results/comoe-vs-lora/results/` holds those reported in `docs/results.md`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import yaml

from experiments.common import TRAINING, evaluate, hub_data, moe_embed, prepare, run, saved_results, write_report
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.run import TASKS, select_tasks
from moe_embed.folders import bundled_minilm_path
from moe_embed.options import command_parser, parse

logger = logging.getLogger("experiment")
VARIANTS = {
    "lora-r16": {"arch": "lora", "adapter": {"lora_rank": 16, "lora_alpha": 32}},
    "lora-r66": {"arch": "lora", "adapter": {"lora_rank": 66, "lora_alpha": 132}},
    "moe-lora": {"arch": "comoe", "adapter": {"contrastive_loss_coef": 0.0}},
    "comoe": {"arch": "comoe", "adapter": {"contrastive_loss_coef": 0.01}},
}
ROUTED = ("moe-lora", "comoe")
LEARNING_RATE = 2.0e-4  # the paper's (appendix D), for adapters
# Tasks whose train split is in `experiments.prepare_data`'s rows: SciFact train claims (shared corpus),
# the classification train splits (also the clustering tasks' texts), TREC train questions, SICK train
# pairs (MTEB's SICK-R scores its train split too), STS12 and STS-B train pairs among the paraphrases.
IN_DOMAIN = (
    "STSBenchmark",
    "SICK-R",
    "SciFact",
    "Banking77Classification",
    "EmotionClassification",
    "AmazonCounterfactualClassification",
    "Banking77Clustering",
    "TRECClustering",
)
DEFAULT_TASKS = [name for name in TASKS if name != "SciFact"]


def variant_settings(name: str) -> dict:
    """Training settings of a variant: one of `VARIANTS`, or `comoe-l<λ>` (CoMoE with that λ)."""
    if name in VARIANTS:
        return VARIANTS[name]
    if name.startswith("comoe-l"):
        return {"arch": "comoe", "adapter": {"contrastive_loss_coef": float(name.removeprefix("comoe-l"))}}
    raise ValueError(f"unknown variant {name!r}")


def train(out: Path, variant: str, seed: int, tasks: dict) -> Path:
    """Train one variant for one seed from `ic-base`; returns its folder."""
    folder = out / "runs" / f"{variant}-s{seed}"
    if (folder / "config_sentence_transformers.json").exists():
        return folder
    settings = variant_settings(variant)
    config = {
        **TRAINING,
        "learning_rate": LEARNING_RATE,
        "seed": seed,
        "output_dir": str(folder),
        "tasks": tasks,
        "model": str(out / "ic-base"),
        "arch": settings["arch"],
        "adapter": settings["adapter"],
    }
    path = out / "configs" / f"{folder.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run(moe_embed("train", "--config", str(path)), out / "logs" / f"{folder.name}.log")
    return folder


def trainable_parameters(variant: str, base: Path) -> int:
    """Trainable parameters of a variant, counted on the model the training CLI builds (untrained)."""
    from transformers import AutoConfig, AutoModel

    from moe_embed.convert.bases import encoder_fields
    from moe_embed.convert.options import CoMoeOptions
    from moe_embed.training.train import lora_config

    settings = variant_settings(variant)
    adapter = CoMoeOptions(**settings["adapter"])
    dense = AutoConfig.from_pretrained(base)
    if settings["arch"] == "lora":
        from peft import get_peft_model

        model = get_peft_model(AutoModel.from_config(dense), lora_config(adapter, dense.num_hidden_layers))
    else:
        from moe_embed.modeling.configuration_comoe import CoMoeBertConfig
        from moe_embed.modeling.modeling_comoe import CoMoeBertModel

        config = CoMoeBertConfig(
            **encoder_fields(dense),
            num_local_experts=adapter.num_local_experts,
            num_experts_per_tok=adapter.num_experts_per_tok,
            lora_rank=adapter.lora_rank,
            target_modules=adapter.target_modules,
            adapter_layers=adapter.adapter_layers,
        )
        model = CoMoeBertModel(config)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def expert_usage(out: Path, name: str, model: Path, tasks: str) -> None:
    """`moe_embed.evaluation.expert_usage` of a routed run (on the texts of `OUTPUT/hubdata`): `OUTPUT/usage/NAME.json`
    and `.png`."""
    result = out / "usage" / f"{name}.json"
    if not result.exists():
        result.parent.mkdir(parents=True, exist_ok=True)
        command = ["-m", "moe_embed.evaluation.expert_usage", str(model), "--tasks", tasks, "--output", str(result)]
        command += ["--data-dir", str(hub_data(out))]
        run(command + ["--plot", str(result.with_suffix(".png"))], out / "logs" / f"usage-{name}.log")


def main(argv: list[str] | None = None, prog: str | None = None) -> str:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="folder for data, models, logs, results and report.md")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default 0,1,2)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument("--sweep", default="0.001,0.1", help="extra λ values for CoMoE on --sweep-seed ('' for none)")
    parser.add_argument("--sweep-seed", type=int, default=0, help="seed of the λ sweep (default 0)")
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help="evaluation tasks (default: all but SciFact)")
    parser.add_argument("--usage-tasks", default=",".join(DEFAULT_TASKS), help="tasks of the expert-usage tables")
    parser.add_argument("--report-only", action="store_true", help="write report.md from OUTPUT/results only")
    parser.add_argument("--reference", default="lora-r16", help="run the per-seed differences are taken to")
    args = parse(parser, argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes names from {','.join(VARIANTS)}, got {args.variants!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        sweep = [f"comoe-l{float(x):g}" for x in args.sweep.split(",") if x.strip()]
        task_names = select_tasks(args.tasks)
        select_tasks(args.usage_tasks)
    except (ValueError, UsageError) as error:
        parser.error(str(error))
    if args.reference not in [*variants, *sweep]:
        parser.error(f"--reference must be one of the runs ({','.join([*variants, *sweep])}), got {args.reference!r}")
    out = Path(args.output).resolve()
    plan = [(v, s) for s in seeds for v in variants] + [(v, args.sweep_seed) for v in sweep]
    runs = {"base": {None: "base"}}
    for variant, seed in plan:
        runs.setdefault(variant, {})[seed] = f"{variant}-s{seed}"
    if not args.report_only:
        tasks = prepare(out)
        evaluate(out, "base", bundled_minilm_path(), ",".join(task_names))
        for variant, seed in plan:  # seed 0 of every variant first, so a partial run compares them all
            name = f"{variant}-s{seed}"
            folder = out / "runs" / name
            if not (out / "results" / f"{name}.json").exists():
                folder = train(out, variant, seed, tasks)
            evaluate(out, name, str(folder), ",".join(task_names))
            if variant in ROUTED or variant in sweep:
                if folder.is_dir():
                    expert_usage(out, name, folder, args.usage_tasks)
            write_report(out, saved_results(out, runs), task_names, args.reference, groups=domain_groups(task_names))
    text = write_report(out, saved_results(out, runs), task_names, args.reference, groups=domain_groups(task_names))
    base = out / "ic-base" if (out / "ic-base").is_dir() else bundled_minilm_path()
    parameters = {variant: trainable_parameters(variant, base) for variant in runs if variant != "base"}
    extra = (
        "\nTrainable parameters:\n\n| run | trainable |\n|---|---:|\n"
        + "".join(f"| {variant} | {count:,} |\n" for variant, count in parameters.items())
        + usage_report(out)
    )
    with open(out / "report.md", "a") as handle:
        handle.write(extra)
    print(extra, flush=True)
    return text + extra


def usage_report(out: Path) -> str:
    """Markdown over `OUTPUT/usage/*.json`: per run and layer, the mean pairwise cosine of expert
    outputs, and the most-used expert's share of the routing (mean over tasks, and its range over
    tasks: how much the routing depends on the task)."""
    usages = {path.stem: json.loads(path.read_text()) for path in sorted((out / "usage").glob("*.json"))}
    if not usages:
        return ""
    layers = [row["layer"] for row in next(iter(next(iter(usages.values())).values()))]
    lines = []
    for title, cell in (
        ("Mean pairwise cosine between expert outputs (mean over tasks)", _mean_cosine),
        ("Share of the most-used expert, % (mean over tasks, min-max over tasks)", _top_share),
    ):
        lines += ["", f"{title}:", "", "| run | " + " | ".join(f"layer {x}" for x in layers) + " |"]
        lines.append("|---|" + "---:|" * len(layers))
        lines += [
            f"| {name} | " + " | ".join(cell(u, i) for i in range(len(layers))) + " |" for name, u in usages.items()
        ]
    return "\n".join(lines) + "\n"


def _mean_cosine(usage: dict, layer: int) -> str:
    values = [rows[layer]["cosine"] for rows in usage.values() if rows[layer]["cosine"] is not None]
    return f"{sum(values) / len(values):.3f}" if values else "—"


def _top_share(usage: dict, layer: int) -> str:
    values = [100 * max(rows[layer]["shares"]) for rows in usage.values()]
    return f"{sum(values) / len(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def domain_groups(task_names: list[str]) -> dict[str, list[str]]:
    """The averages the report shows: in-domain tasks, out-of-domain tasks."""
    groups = {
        "in-domain": [t for t in task_names if t in IN_DOMAIN],
        "out-of-domain": [t for t in task_names if t not in IN_DOMAIN],
    }
    return {name: tasks for name, tasks in groups.items() if tasks}


if __name__ == "__main__":
    run_cli(main)
