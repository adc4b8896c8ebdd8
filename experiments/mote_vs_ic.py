"""The MoTE paper's central comparison on this machine's scale (issue 5, experiment).

    python -m experiments.mote_vs_ic --output models/experiment --seeds 0,1,2

From the bundled all-MiniLM-L6-v2, with identical data (`experiments.prepare_data`), steps and
seeds, it trains

- `ic`: the dense model with instruction prefixes (the same four prompts as MoTE), TA-CL;
- `mote`: MoTE upcycled from it, TA-CL (per-task batching and temperatures);
- `static`: MoTE with static training (one entry, heterogeneous batches, τ = 0.03);
- `ea`: Expert Averaging of `mote` (`convert/merge_experts.py`), a dense model;

then evaluates them and the untouched base (`evaluation.run`, no prompts) and writes a report
(mean ± sample standard deviation over seeds, per task, per task type and on average) to
`OUTPUT/report.md`. Every step is skipped when its output exists, so an interrupted run resumes;
a run whose scores are in `OUTPUT/results/` is not retrained (`docs/experiment/results/` holds the
scores reported in `docs/results.md`: copy them there to add seeds or variants without redoing
the rest).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convert.checkpoint import bundled_minilm_path
from convert.upcycle import save_dense_with_prompts
from evaluation.run import TASKS, select_tasks
from experiments import prepare_data
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("experiment")
REPO = Path(__file__).resolve().parent.parent
VARIANTS = ("ic", "mote", "static", "ea")
# One epoch of (anchor, positive) pairs, inputs cut to 64 tokens: about 3 minutes a run on 2 CPU cores.
TRAINING = {
    "batch_size": 32,
    "epochs": 1,
    "learning_rate": 2.0e-5,
    "warmup_steps": 12,
    "max_seq_length": 64,
    "save_steps": 0,
    "logging_steps": 16,
}


def run(command: list[str], log: Path) -> None:
    """Run a repository CLI with this interpreter; its output goes to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as handle:
        result = subprocess.run(
            [sys.executable, *command],
            cwd=REPO,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    if result.returncode:
        raise SystemExit(f"error: `{' '.join(command)}` failed (exit {result.returncode}); see {log}")
    logger.info("%s done in %.0f s", log.stem, time.perf_counter() - start)


def prepare(out: Path) -> dict:
    """Training data, the upcycled MoTE and the dense model with MoTE's prompts; returns `tasks:`."""
    tasks = prepare_data.write(prepare_data.build(prepare_data.D.data_dir()), out / "data", negatives=False)
    if not (out / "mote-base" / "config.json").exists():
        run(
            ["convert/upcycle.py", "--base", bundled_minilm_path(), "--output", str(out / "mote-base")],
            out / "logs" / "upcycle.log",
        )
    if not (out / "ic-base" / "config.json").exists():
        save_dense_with_prompts(out / "mote-base", out / "ic-base")
    return tasks


def train(out: Path, variant: str, seed: int, tasks: dict) -> Path:
    """Train (or merge, for `ea`) one variant for one seed; returns its folder."""
    folder = out / "runs" / f"{variant}-s{seed}"
    if (folder / "config_sentence_transformers.json").exists():
        return folder
    if variant == "ea":
        source = train(out, "mote", seed, tasks)
        run(["convert/merge_experts.py", str(source), "--output", str(folder)], out / "logs" / f"{folder.name}.log")
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
    run(["-m", "training.train", "--config", str(path)], out / "logs" / f"{folder.name}.log")
    return folder


def evaluate(out: Path, name: str, model: str, tasks: str) -> dict:
    result = out / "results" / f"{name}.json"
    if not result.exists():
        result.parent.mkdir(parents=True, exist_ok=True)
        run(
            ["-m", "evaluation.run", model, "--tasks", tasks, "--output", str(result), "--trust-remote-code"],
            out / "logs" / f"eval-{name}.log",
        )
    return json.loads(result.read_text())


def summary(values: list[float], signed: bool = False) -> str:
    """`mean ± sample sd` (just the value for one, — for none); `signed` shows the sign of the mean."""
    if not values:
        return "—"
    mean = f"{statistics.mean(values):+.2f}" if signed else f"{statistics.mean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.2f}"


def task_type_groups(task_names: list[str]) -> dict[str, list[str]]:
    """The tasks of each task type, in order of first appearance."""
    types = dict.fromkeys(TASKS[t].type for t in task_names)
    return {kind: [t for t in task_names if TASKS[t].type == kind] for kind in types}


def scores(run: dict, task_names: list[str], groups: dict[str, list[str]] | None = None) -> dict[str, float]:
    """A run's score per task, per group of tasks (mean over its tasks; default: per task type) and on average."""
    row = {t: run[t]["main_score"] for t in task_names}
    for name, members in (groups or task_type_groups(task_names)).items():
        row[name] = statistics.mean(row[t] for t in members)
    row["average"] = statistics.mean(row[t] for t in task_names)
    return row


def report(
    results: dict[str, dict[int, dict]],
    task_names: list[str],
    reference: str = "ic",
    groups: dict[str, list[str]] | None = None,
) -> str:
    """Markdown for `results` (model -> seed -> scores; seed None for the untrained base): mean ± sd
    over seeds per task, per group of tasks (default: per task type) and on average; then each
    model's per-seed difference to `reference` (same seed, so same data order), mean ± sd over the
    seeds both have (every seed, against a reference that is one untrained model)."""
    groups = groups or task_type_groups(task_names)
    keys = task_names + list(groups) + ["average"]
    columns = task_names + [f"{name} (avg)" for name in groups] + ["average", "seeds"]
    lines = ["| model | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for name, runs in results.items():
        rows = [scores(run, task_names, groups) for run in runs.values()]
        lines.append(
            f"| {name} | " + " | ".join(summary([row[key] for row in rows]) for key in keys) + f" | {len(runs)} |"
        )
    ref = results.get(reference, {})

    def shared_seeds(name: str) -> list:
        """The seeds `name` shares with the reference; every seed when the reference is one untrained model."""
        common = set(results[name]) & set(ref)
        return sorted(common, key=str) if common else (sorted(results[name], key=str) if None in ref else [])

    paired = [name for name in results if name != reference and shared_seeds(name)]
    if paired:
        lines += [
            "",
            f"Difference to {reference}, same seed:",
            "",
            "| model | " + " | ".join(columns) + " |",
            "|---|" + "---:|" * len(columns),
        ]
        for name in paired:
            seeds = shared_seeds(name)
            deltas = [
                {
                    key: scores(results[name][seed], task_names, groups)[key]
                    - scores(ref.get(seed, ref.get(None)), task_names, groups)[key]
                    for key in keys
                }
                for seed in seeds
            ]
            cells = " | ".join(summary([delta[key] for delta in deltas], signed=True) for key in keys)
            lines.append(f"| {name} − {reference} | {cells} | {len(seeds)} |")
    return "\n".join(lines) + "\n"


def write_report(
    out: Path,
    results: dict[str, dict[int, dict]],
    task_names: list[str],
    reference: str = "ic",
    groups: dict[str, list[str]] | None = None,
) -> str:
    """`report(results)` written to `out/report.md` and printed."""
    text = report(results, task_names, reference, groups)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(text)
    print(text, flush=True)
    return text


def saved_results(out: Path, runs: dict[str, dict[int, str]]) -> dict[str, dict[int, dict]]:
    """The scores in `out/results/` that exist (`runs`: model -> seed -> result name)."""
    results = {}
    for model, names in runs.items():
        found = {
            seed: json.loads(path.read_text())
            for seed, name in names.items()
            if (path := out / "results" / f"{name}.json").exists()
        }
        if found:
            results[model] = found
    return results


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--output", required=True, help="folder for data, models, logs, results and report.md")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default 0,1,2)")
    parser.add_argument("--tasks", default="all", help="evaluation tasks (evaluation.run names, or 'all')")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"subset of {','.join(VARIANTS)}")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="write report.md from the scores in OUTPUT/results only (nothing is trained or evaluated)",
    )
    parser.add_argument("--reference", default="ic", help="variant the per-seed differences are taken to (default ic)")
    args = parser.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not variants or set(variants) - set(VARIANTS):
        parser.error(f"--variants takes names from {','.join(VARIANTS)}, got {args.variants!r}")
    if args.reference not in variants:
        parser.error(f"--reference must be one of the variants ({','.join(variants)}), got {args.reference!r}")
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
        task_names = [task.name for task in select_tasks(args.tasks)]
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
