"""The MoTE paper's central comparison on this machine's scale.

    python -m experiments.mote_vs_ic --output models/experiment --seeds 0,1,2

From the bundled all-MiniLM-L6-v2, with identical data (`experiments.prepare_data`), steps and
seeds, it trains

- `ic`: the dense model with instruction prefixes (the same four prompts as MoTE), TA-CL;
- `mote`: MoTE upcycled from it, TA-CL (per-task batching and temperatures);
- `static`: MoTE with static training (one entry, heterogeneous batches, τ = 0.03);
- `ea`: Expert Averaging of `mote` (`moe-embed merge`), a dense model;

then evaluates them and the untouched base (`moe-embed evaluate`, no prompts, on the Hub-layout copies of
`../shared/data` in `OUTPUT/hubdata`) and writes a report (mean ± sample standard deviation over seeds, per
task, per task type and on average) to `OUTPUT/report.md`. Every step is skipped when its output exists, so
an interrupted run resumes; a run whose scores are in `OUTPUT/results/` is not retrained
(`experiments/results/mote-vs-ic/results/` holds the scores reported in `docs/results.md`: copy them there to
add seeds or variants without redoing the rest).
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from experiments.common import TRAINING, evaluate, moe_embed, prepare, run, saved_results, write_report
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.run import select_tasks
from moe_embed.folders import bundled_minilm_path
from moe_embed.options import command_parser, parse

logger = logging.getLogger(__name__)
VARIANTS = ("ic", "mote", "static", "ea")


def train(out: Path, variant: str, seed: int, tasks: dict) -> Path:
    """Train (or merge, for `ea`) one variant for one seed; returns its folder."""
    folder = out / "runs" / f"{variant}-s{seed}"
    if (folder / "config_sentence_transformers.json").exists():
        return folder
    if variant == "ea":
        source = train(out, "mote", seed, tasks)
        run(moe_embed("merge", str(source), "--output", str(folder)), out / "logs" / f"{folder.name}.log")
        return folder
    config = {
        **TRAINING,
        "seed": seed,
        "output_dir": str(folder),
        "tasks": tasks,
        "model": str(out / ("ic-base" if variant == "ic" else "mote-base")),
        "trust_remote_code": variant != "ic",
    }
    if variant == "static":
        config.update(curriculum="static", temperature=0.03)
    path = out / "configs" / f"{folder.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    run(moe_embed("train", "--config", str(path)), out / "logs" / f"{folder.name}.log")
    return folder


def main(argv: list[str] | None = None, prog: str | None = None) -> str:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="folder for data, models, logs, results and report.md")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default 0,1,2)")
    parser.add_argument("--tasks", default="all", help="evaluation tasks (moe_embed.evaluation.run names, or 'all')")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write report.md from the scores in OUTPUT/results only (nothing is trained or evaluated)",
    )
    parser.add_argument("--reference", default="ic", help="variant the per-seed differences are taken to (default ic)")
    args = parse(parser, argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes names from {','.join(VARIANTS)}, got {args.variants!r}")
    if args.reference not in variants:
        parser.error(f"--reference must be one of the variants ({','.join(variants)}), got {args.reference!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        task_names = select_tasks(args.tasks)
    except (ValueError, UsageError) as error:
        parser.error(str(error))
    out = Path(args.output).resolve()
    if args.report_only:
        runs = {"base (no prompts)": {None: "base"}, **{v: {s: f"{v}-s{s}" for s in seeds} for v in variants}}
        return write_report(out, saved_results(out, runs), task_names, args.reference)
    tasks = prepare(out)
    results = {"base (no prompts)": {None: evaluate(out, "base", bundled_minilm_path(), ",".join(task_names))}}
    for seed in seeds:  # seed by seed, so a partial run already compares every variant
        for variant in variants:
            name = f"{variant}-s{seed}"
            # a run whose scores exist is not trained again (results/ may come from an earlier machine)
            folder = (
                out / "runs" / name if (out / "results" / f"{name}.json").exists() else train(out, variant, seed, tasks)
            )
            results.setdefault(variant, {})[seed] = evaluate(out, name, str(folder), ",".join(task_names))
        text = write_report(out, results, task_names, args.reference)
    return text


if __name__ == "__main__":
    run_cli(main)
