"""Train without forgetting: which recipe specialises MoTE and stays at or above the untouched model
outside its training data.

    python -m experiments.forgetting --output models/forgetting --seeds 0,1,2 \\
        --results experiments/results/forgetting/results

Every run is the recommended recipe, `examples/train_mote.yaml` (its data, steps, learning rate and
schedule), with the settings that differ between variants replaced: from the bundled all-MiniLM-L6-v2, on
broad pairs (SQuAD question -> paragraph, SNLI and RTE entailments, COCO captions) and the train splits of
four suite tasks (`IN_DOMAIN`), one epoch, TA-CL, seeds 0-2; every MoTE variant is upcycled from the dense
model by the training config itself (`arch: mote`):

- `full`: the first recipe: every weight trains, the instruction prefix is fed;
- `experts`: only the task experts train (the shared weights stay bit-identical);
- `experts+distill`: and an embedding-distillation term to the frozen starting model (weight 1);
- `route+experts+distill`: and the prefix only routes (`prefix_routes_only`): the encoder sees plain text;
- `route+experts+distill+dev`: and the checkpoint (step 0 included) is chosen on STS-B dev;
- `route+experts+distill+dev+lr1e-4`: and the experts train at 1e-4;
- `ic`: the dense model with the same prompts, its blocks that MoTE turns into experts trained, with the
  same distillation (instruction conditioning trained the same way as `experts+distill`); `ic+lr1e-4+dev`
  the same trained as the recipe trains MoTE;
- with `--variants`: `moe`, `moe+recipe`, `comoe`, `comoe+recipe`: the token-routed MoE and CoMoE trained
  as the first recipe and as the recommended one trains MoTE.

The untouched model is scored with and without the prompts. The suite is reported split into in-domain
tasks (their train split is in the mix) and held-out ones (neither their splits nor their sources are),
with each run's paired difference to the untouched model (no prompts), same seed for `ic`.
Training reads the recipe's `{data}/` files from `../shared/data` (`$MOE_EMBED_SHARED`); its `hub:` datasets,
the dev set and the evaluation read the Hub-layout copies of that folder in `OUTPUT/hubdata`
(`experiments.common.hub_data`).
Every step is skipped when its result exists, so a run resumes where it stopped, also in a later session
when `--results` points at a committed folder.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import yaml

from experiments.common import evaluate_command, hub_data, moe_embed, read_scores, report, run, shared_data
from moe_embed.convert.instruction_baseline import save_dense_with_prompts
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.run import TASKS
from moe_embed.folders import bundled_minilm_path
from moe_embed.options import command_parser, parse

logger = logging.getLogger("experiment")

RECIPE = Path(__file__).resolve().parent.parent / "examples" / "train_mote.yaml"
# what a variant sets; everything else comes from the recipe
VARIANT_KEYS = ("arch", "upcycle", "trainable", "expert_learning_rate", "regularizer", "dev", "model", "output_dir")
# suite tasks whose train split is in the recipe's data, and those kept entirely out of it: neither their
# splits nor their sources (MRPC and the STS, SICK and TrecQA pairs of positive_pairs.jsonl are sources of
# STS-B, SICK-R or the held-out sets no one here sees, so the recipe does not use them)
IN_DOMAIN = ["SciFact", "AmazonCounterfactualClassification", "SST2Classification", "TRECClustering"]
HELD_OUT = [
    "STSBenchmark",
    "SICK-R",
    "TwitterURLCorpus",
    "Banking77Classification",
    "EmotionClassification",
    "Banking77Clustering",
]
RECOMMENDED = "route+experts+distill+dev+lr1e-4"
DISTILL = {"kind": "distill", "weight": 1.0}
DEV = {"tasks": ["stsb-dev"], "eval_steps": 36}
ROUTE = {"arch": "mote", "upcycle": {"prefix_routes_only": True}}
# how the recommended recipe trains: experts-only at the shared learning rate barely moves (seed 0: in-domain
# +1.4 against +9.3 for `full`), so the experts get five times it; distillation; dev selection
RECIPE_TRAINING = {"trainable": "experts", "expert_learning_rate": 1.0e-4, "regularizer": DISTILL, "dev": DEV}
MOE = {"arch": "moe", "upcycle": {"norm_topk_prob": True}}  # renormalised top-k: it starts as the dense model
VARIANTS = {
    "full": {"arch": "mote"},
    "experts": {"arch": "mote", "trainable": "experts"},
    "experts+distill": {"arch": "mote", "trainable": "experts", "regularizer": DISTILL},
    "route+experts+distill": {**ROUTE, "trainable": "experts", "regularizer": DISTILL},
    "route+experts+distill+dev": {**ROUTE, "trainable": "experts", "regularizer": DISTILL, "dev": DEV},
    RECOMMENDED: {**ROUTE, **RECIPE_TRAINING},
    # the recipe with three times the distillation: do the classification expert's small held-out losses
    # (SICK-R, Banking77) close when it is held closer to the starting model?
    RECOMMENDED + "+distill3": {**ROUTE, **RECIPE_TRAINING, "regularizer": {**DISTILL, "weight": 3.0}},
    "ic": {"trainable": "experts", "regularizer": DISTILL},  # on the dense model with MoTE's prompts
    "ic+lr1e-4+dev": RECIPE_TRAINING,  # IC trained as the recipe trains MoTE (the dense model's expert blocks)
    # what transfers to the other expert models: the token-routed MoE and CoMoE (adapters only by
    # construction), each trained as the first recipe and as the recommended one trains MoTE; prefix-only routing has no
    # counterpart in either: their routers read tokens, so the prompt text stays in the input
    "moe": MOE,
    "moe+recipe": {**MOE, **RECIPE_TRAINING},
    "comoe": {"arch": "comoe"},
    "comoe+recipe": {"arch": "comoe", **{k: v for k, v in RECIPE_TRAINING.items() if k != "trainable"}},
}
# the variants a plain run trains (the others: --variants)
DEFAULT_VARIANTS = (
    "full",
    "experts",
    "experts+distill",
    "route+experts+distill",
    "route+experts+distill+dev",
    "route+experts+distill+dev+lr1e-4",
    "ic",
    "ic+lr1e-4+dev",
)
BASELINES = {"untouched (no prompts)": "untouched", "untouched (prompts)": "untouched-prompts"}


def recipe_base() -> dict:
    """The recipe's settings that every variant shares."""
    return {k: v for k, v in yaml.safe_load(RECIPE.read_text()).items() if k not in VARIANT_KEYS}


def in_folder(tasks: dict, shared: Path) -> dict:
    """The recipe's `tasks:` with its `{data}/` paths pointing into the shared data folder `shared`."""
    return {
        kind: [
            {**spec, "path": str(shared / spec["path"].removeprefix("{data}/"))}
            if str(spec.get("path", "")).startswith("{data}/")
            else spec
            for spec in specs
        ]
        for kind, specs in tasks.items()
    }


def config(out: Path, variant: str, seed: int) -> dict:
    """The training config of one variant and seed: the recipe, the variant's settings, its `{data}/` files in the
    shared data folder, its Hub datasets and dev set from the copies in `OUT/hubdata`."""
    base = recipe_base()
    return {
        **base,
        **VARIANTS[variant],
        "tasks": in_folder(base["tasks"], shared_data()),
        "data_dir": str(hub_data(out)),  # where the dev set (STS-B validation) and any hub: dataset are read
        "seed": seed,
        "output_dir": str(out / "runs" / f"{variant}-s{seed}"),
        "overwrite_output_dir": True,  # a run that stopped half-way is redone
        "model": str(out / "ic-base") if variant.startswith("ic") else bundled_minilm_path(),
    }


def prepare(out: Path) -> None:
    """The dense model with MoTE's prompts (the IC model, and the untouched model scored with prompts)."""
    if not (out / "ic-base" / "config.json").exists():
        upcycle(upcycle_options(output=out / "mote-prompts", overwrite=True))  # only its prompts are read
        save_dense_with_prompts(out / "mote-prompts", out / "ic-base")
        shutil.rmtree(out / "mote-prompts")


def train(out: Path, variant: str, seed: int, results: Path) -> Path:
    """Train one variant for one seed (unless its folder exists); returns its folder."""
    folder = out / "runs" / f"{variant}-s{seed}"
    if (folder / "config_sentence_transformers.json").exists():
        return folder
    path = out / "configs" / f"{folder.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config(out, variant, seed), sort_keys=False))
    run(moe_embed("train", "--config", str(path)), out / "logs" / f"{folder.name}.log")
    if (folder / "dev_scores.json").exists():
        shutil.copy2(folder / "dev_scores.json", results / f"{folder.name}.dev.json")
    return folder


def evaluate(out: Path, results: Path, name: str, model: str, tasks: list[str]) -> dict:
    """The suite scores of `model` (from `results/NAME.json` when it exists)."""
    path = results / f"{name}.json"
    if not path.exists():
        run(evaluate_command(model, ",".join(tasks), path, out), out / "logs" / f"eval-{name}.log")
    return read_scores(path)


def split_report(results: dict, tasks: list[str]) -> str:
    """Scores per task, in-domain and held-out averages; paired differences to the untouched model and to IC."""
    groups = {
        "in-domain": [t for t in IN_DOMAIN if t in tasks],
        "held-out": [t for t in HELD_OUT if t in tasks],
    }
    groups = {name: members for name, members in groups.items() if members}
    text = report(results, tasks, "untouched (no prompts)", groups)
    if "ic" in results:
        mote = {k: v for k, v in results.items() if k not in BASELINES}
        text += "\n" + report(mote, tasks, "ic", groups).split("\n\n", 1)[-1]
    return text


def main(argv: list[str] | None = None, prog: str | None = None) -> str:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="folder for data, models, configs and logs")
    parser.add_argument("--results", default=None, help="folder of the score files (default: OUTPUT/results)")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds")
    parser.add_argument(
        "--variants",
        default=None,
        help=f"names from {','.join(VARIANTS)} (default: {','.join(DEFAULT_VARIANTS)}; with --report-only, all)",
    )
    parser.add_argument("--tasks", default="all", help="suite tasks (moe_embed.evaluation.tasks.SUITE names, or 'all')")
    parser.add_argument("--report-only", action="store_true", help="write the report from existing scores only")
    args = parse(parser, argv)
    if args.variants is None:
        args.variants = ",".join(VARIANTS if args.report_only else DEFAULT_VARIANTS)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        raise UsageError(f"--variants takes names from {','.join(VARIANTS)}, got {args.variants!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise UsageError(f"--seeds expects comma-separated integers, got {args.seeds!r}") from None
    tasks = list(TASKS) if args.tasks == "all" else args.tasks.split(",")
    if set(tasks) - set(TASKS):
        raise UsageError(f"unknown tasks {sorted(set(tasks) - set(TASKS))}; expected names from {', '.join(TASKS)}")
    out = Path(args.output).resolve()
    results_dir = Path(args.results).resolve() if args.results else out / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    found = {}
    if not args.report_only:
        prepare(out)
        found["untouched (no prompts)"] = {None: evaluate(out, results_dir, "untouched", bundled_minilm_path(), tasks)}
        prompts = evaluate(out, results_dir, "untouched-prompts", str(out / "ic-base"), tasks)
        found["untouched (prompts)"] = {None: prompts}
        for seed in seeds:  # seed by seed, so a partial run already compares every variant
            for variant in variants:
                name = f"{variant}-s{seed}"
                if not (results_dir / f"{name}.json").exists():
                    train(out, variant, seed, results_dir)
                found.setdefault(variant, {})[seed] = evaluate(out, results_dir, name, str(out / "runs" / name), tasks)
                write(results_dir, found, tasks)
    found = {
        label: {None: read_scores(results_dir / f"{name}.json")}
        for label, name in BASELINES.items()
        if (results_dir / f"{name}.json").exists()
    }
    for variant in variants:
        for seed in seeds:
            if (results_dir / f"{variant}-s{seed}.json").exists():
                found.setdefault(variant, {})[seed] = read_scores(results_dir / f"{variant}-s{seed}.json")
    return write(results_dir, found, tasks)


def write(results_dir: Path, found: dict, tasks: list[str]) -> str:
    text = split_report(found, tasks)
    (results_dir.parent / "report.md").write_text(text)
    print(text, flush=True)
    return text


if __name__ == "__main__":
    run_cli(main)
