"""Evaluate an embedding model on the suite's MTEB tasks, scored by mteb's own evaluators.

    moe-embed evaluate models/mote-minilm --trust-remote-code --tasks STSBenchmark,SciFact --output results.json
    moe-embed evaluate sentence-transformers/all-MiniLM-L6-v2 --tasks all --data-dir data

(`python -m moe_embed.evaluation.run ...` is the same command.)
The model is evaluated as `mteb.evaluate(SentenceTransformer(model), task)`: mteb picks each task's prompt from
the model's own prompts (a MoTE folder names one per mteb task type, so every type reaches its expert). Data
comes from the Hub (or its cache), or from the copies in `--data-dir` (see `moe-embed data`); every task's data
is read before the model is loaded, so a missing dataset is said at once, in one line.
Scores are on a 0-100 scale; `--output` writes `{task: {"main_score", "metric", "type", "hf_task_type",
"dataset", "revision", "subset", "split"}}` (what `moe-embed push --results` puts in a model card's
`model-index`), again after every task, and a markdown table goes to stdout.
"""

from __future__ import annotations

import difflib
import json
import logging
from dataclasses import dataclass

from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.tasks import SUITE
from moe_embed.options import option, parse_options

logger = logging.getLogger(__name__)

TASKS = tuple(SUITE)


def select_tasks(spec: str) -> list[str]:
    """Comma-separated suite task names (or `all`); a clear error for unknown names."""
    if spec.strip() == "all":
        return list(TASKS)
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in SUITE]
    if unknown or not names:
        hints = [f"{name!r}: did you mean {suggest_task(name)}?" for name in unknown if suggest_task(name)]
        raise UsageError(
            f"unknown tasks {unknown or spec!r}"
            + (f" ({'; '.join(hints)})" if hints else "")
            + f"; expected comma-separated names from: {', '.join(TASKS)}"
        )
    return names


def suggest_task(name: str) -> str | None:
    """The suite's task that `name` most likely means: the same name in another case, else the closest spelling."""
    folded = {task.casefold(): task for task in TASKS}
    close = difflib.get_close_matches(name.casefold(), list(folded), n=1)  # the same name in any case first
    return folded[close[0]] if close else None


def load_tasks(names: list[str], data_dir: str | None = None) -> dict:
    """The mteb tasks `names` with their data read (from `data_dir`'s copies, else the Hub): name -> task."""
    from moe_embed.data import data_dir as find_data_dir
    from moe_embed.evaluation.tasks import get_task, load

    folder = find_data_dir(data_dir)
    return {name: load(get_task(name), folder) for name in names}


def evaluate(model, task, batch_size: int = 64) -> dict:
    """`model`'s result on the loaded mteb `task`: its main score (0-100) and where it was measured."""
    from moe_embed.evaluation.tasks import repo_of, run

    result = run(model, task, batch_size)
    split = task.metadata.eval_splits[0]
    subsets = sorted({entry["hf_subset"] for entry in result.scores[split]})
    return {
        "main_score": round(100 * result.get_score(splits=[split]), 4),
        "metric": task.metadata.main_score,
        "type": task.metadata.type,
        "hf_task_type": task.metadata._hf_task_type()[0],  # the Hub's task category, as mteb's own cards name it
        "dataset": repo_of(task),
        "revision": task.metadata.dataset.get("revision"),
        "subset": ",".join(subsets),
        "split": split,
    }


@dataclass
class EvaluateOptions:
    """`moe-embed evaluate`'s options (its `--help` is generated from the fields)."""

    model: str = option(required=True, positional=True, help="model folder or Hub id (loaded with SentenceTransformer)")
    tasks: str = option("all", help=f"comma-separated task names or 'all': {', '.join(TASKS)}")
    output: str | None = option(help="JSON file to write the scores to (written again after every task)")
    overwrite: bool = option(False, help="replace --output if it exists")
    data_dir: str | None = option(help=DATA_DIR_HELP)
    batch_size: int = option(64, help="encoding batch size")
    trust_remote_code: bool = option(False, help="allow the model folder's own code (MoTE, MoE, CoMoE, AEA)")


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    from moe_embed.files import atomic_write_text
    from moe_embed.folders import check_output, load_sentence_transformer, open_model_folder

    args = parse_options(EvaluateOptions, argv, __doc__, prog)
    names = select_tasks(args.tasks)
    # every input checked before the long steps: the model folder, the output, the data of every task
    folder = open_model_folder(args.model, trust_remote_code=args.trust_remote_code)
    if args.output:
        check_output(args.output, overwrite=args.overwrite)
    tasks = load_tasks(names, args.data_dir)
    model = load_sentence_transformer(folder.path, trust_remote_code=args.trust_remote_code)
    results = {}
    for name in names:
        logger.info("evaluating %s", name)
        results[name] = evaluate(model, tasks[name], args.batch_size)
        logger.info("%s: %.2f (%s)", name, results[name]["main_score"], results[name]["metric"])
        if args.output:  # what is scored is kept, whatever happens to the next task
            atomic_write_text(args.output, json.dumps(results, indent=2) + "\n", overwrite=True)
    print("| task | type | metric | score |\n|---|---|---|---:|")
    for name, result in results.items():
        print(f"| {name} | {result['type']} | {result['metric']} | {result['main_score']:.2f} |")
    return results


if __name__ == "__main__":
    run_cli(main)
