"""What the experiments share: running a command of this package in a fresh process with its log, their
data, the base models they start from, their evaluation (each result cached in `OUTPUT/results/`, so an
interrupted experiment resumes) and the report (mean ± sd over seeds, per-seed differences).

The experiments are research scripts beside `../shared/data` (`$MOE_EMBED_SHARED`; its README describes the
layout): they train on its files, read where they lie, and evaluate on local copies of the suite's Hub
datasets written from it once per output folder (`OUTPUT/hubdata`, by `experiments.shared_to_hub`), which
`moe-embed evaluate --data-dir` reads.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from experiments.shared_to_hub import SHARED_DATA, write_copies
from moe_embed.errors import UsageError
from moe_embed.evaluation.tasks import SUITE
from moe_embed.folders import bundled_minilm_path

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
SHARED_ENV = "MOE_EMBED_SHARED"
# task names in result files written before the suite ran through mteb
RENAMED_TASKS = {
    "SST2Classification (local)": "SST2Classification",
    "Banking77Clustering (local)": "Banking77Clustering",
    "TRECClustering (local)": "TRECClustering",
}

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


def shared_data(override: str | os.PathLike | None = None) -> Path:
    """The shared data folder the experiments train on: `override` (`--shared`), else `$MOE_EMBED_SHARED`, else
    `../shared/data` beside the repository; a one-line error where it is missing."""
    path = Path(override or os.environ.get(SHARED_ENV) or SHARED_DATA)
    if not path.is_dir():
        origin = "--shared" if override else f"${SHARED_ENV}, else ../shared/data beside the repository"
        raise UsageError(f"shared data folder {path} ({origin}) not found; the experiments train on its files")
    return path


@functools.cache
def hub_data(out: Path) -> Path:
    """`OUT/hubdata`: the suite's datasets as local Hub-layout copies written from the shared data folder (the
    copies already there are kept), for `--data-dir`. Written once per process and output folder."""
    folder = Path(out) / "hubdata"
    written = write_copies(shared_data(), folder)
    if written:
        logger.info("wrote the Hub-layout copies of %s to %s", ", ".join(written), folder)
    return folder


def read_scores(path: Path) -> dict:
    """A result file of `moe-embed evaluate` (task -> scores), older task names renamed to the suite's."""
    return {RENAMED_TASKS.get(task, task): row for task, row in json.loads(Path(path).read_text()).items()}


def moe_embed(*arguments: str) -> list[str]:
    """The interpreter arguments of `moe-embed ARGUMENTS` (the command run by this interpreter), for `run`."""
    return ["-m", "moe_embed.cli", *arguments]


def run(command: list[str], log: Path) -> None:
    """Run a command of this package with this interpreter (`moe_embed(...)`, or `-m module ...`); its output
    goes to `log`."""
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
    from experiments import prepare_data
    from moe_embed.convert.instruction_baseline import save_dense_with_prompts

    tasks = prepare_data.write(prepare_data.build(shared_data()), out / "data", negatives=False)

    if not (out / "mote-base" / "config.json").exists():
        run(
            moe_embed("upcycle", "--base", bundled_minilm_path(), "--output", str(out / "mote-base")),
            out / "logs" / "upcycle.log",
        )
    if not (out / "ic-base" / "config.json").exists():
        save_dense_with_prompts(out / "mote-base", out / "ic-base")
    return tasks


def evaluate_command(model: str, tasks: str, result: Path, out: Path) -> list[str]:
    """`moe-embed evaluate` of `model` on `tasks` into `result`, on the copies in `OUT/hubdata`."""
    data = str(hub_data(out))
    return moe_embed(
        "evaluate", model, "--tasks", tasks, "--output", str(result), "--data-dir", data, "--trust-remote-code"
    )


def evaluate(out: Path, name: str, model: str, tasks: str) -> dict:
    """The scores of `model` on `tasks` (comma-separated), from `OUT/results/NAME.json` when it exists."""
    result = out / "results" / f"{name}.json"
    if not result.exists():
        result.parent.mkdir(parents=True, exist_ok=True)
        run(evaluate_command(model, tasks, result, out), out / "logs" / f"eval-{name}.log")
    return read_scores(result)


def summary(values: list[float], signed: bool = False) -> str:
    """`mean ± sample sd` (just the value for one, — for none); `signed` shows the sign of the mean."""
    if not values:
        return "—"
    mean = f"{statistics.mean(values):+.2f}" if signed else f"{statistics.mean(values):.2f}"
    return mean if len(values) == 1 else f"{mean} ± {statistics.stdev(values):.2f}"


def task_type_groups(task_names: list[str]) -> dict[str, list[str]]:
    """The tasks of each task type (mteb's: STS, Retrieval, ...), in order of first appearance."""
    types = dict.fromkeys(SUITE[t] for t in task_names)
    return {kind: [t for t in task_names if SUITE[t] == kind] for kind in types}


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
            seed: read_scores(path)
            for seed, name in names.items()
            if (path := out / "results" / f"{name}.json").exists()
        }
        if found:
            results[model] = found
    return results
