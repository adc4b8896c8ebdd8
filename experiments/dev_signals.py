"""Can a development set that is not a test split see the recipe's Banking77-clustering loss?

    python -m experiments.dev_signals models/forgetting/runs/route+experts+distill+dev+lr1e-4-s{0,1,2}

Per-expert checkpoint selection (each expert keeps its own best step) can only protect a held-out task when
some dev set moves with it. This scores, for the untouched MiniLM and each given run, candidate dev sets for
the clustering expert, each through the clustering prompt, at the recipe's training length (64 tokens):
V-measure of Emotion validation (6 emotions), SST-2 dev (2 labels) and TREC train (50 fine labels; the
recipe trains on 600 of its 5452 rows), each clustered by mteb as the suite clusters Banking77, and STS-B dev
(Spearman, mteb's STS evaluator). Banking77 itself (train split) is left out: selecting on it would make
Banking77 clustering no longer held out. The data comes from `--data-dir`, by default from Hub-layout copies
of `../shared/data` written for the run (`experiments.shared_to_hub`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

# candidate name -> (Hub dataset, split, text column, label column)
CANDIDATES = {
    "Emotion val": ("mteb/emotion", "validation", "text", "label"),
    "SST-2 dev": ("stanfordnlp/sst2", "validation", "sentence", "label"),
    "TREC train (fine)": ("CogComp/trec", "train", "text", "fine_label"),
}


def clustering_task(name: str, texts: list[str], labels: list):
    """mteb's single-set clustering of `texts` by `labels`, with its data in hand: the protocol and prompt of the
    suite's Banking77Clustering (one mini-batch k-means over every text, V-measure), under another name."""
    from datasets import Dataset, DatasetDict

    from moe_embed.evaluation.tasks import get_task

    task = get_task("Banking77Clustering")
    task.metadata = task.metadata.model_copy(update={"name": name, "description": f"{name}, clustered by label."})
    task.dataset = DatasetDict({"test": Dataset.from_dict({"sentences": [list(texts)], "labels": [list(labels)]})})
    task.data_loaded = True
    return task


def candidate_tasks(folder: Path | None) -> dict:
    """The candidate dev sets (`CANDIDATES`) as clustering tasks, read from the data folder `folder`."""
    from moe_embed.data import load

    tasks = {}
    for name, (repo, split, text, label) in CANDIDATES.items():
        rows = load(repo, None, split, folder=folder, purpose=f"dev signal {name}")
        tasks[name] = clustering_task(name, rows[text], rows[label])
    return tasks


def signals(model, tasks: dict, sts_dev) -> list[float]:
    """`model`'s score (0-100) on each candidate of `tasks`, then on STS-B dev through the clustering prompt."""
    from moe_embed.evaluation.tasks import score

    scores = [score(model, task) for task in tasks.values()]
    if "Clustering" in (model.prompts or {}):  # mteb looks up STS's prompt by its task type
        model.prompts = {**model.prompts, "STS": model.prompts["Clustering"]}
    return scores + [score(model, sts_dev)]


def main(argv: list[str] | None = None, prog: str | None = None) -> list[list[float]]:
    parser = command_parser(__doc__, prog)
    parser.add_argument("runs", nargs="+", help="trained MoTE folders")
    parser.add_argument(
        "--data-dir",
        help="folder of local copies of Hub datasets, as `moe-embed data download` writes (default: copies of "
        "../shared/data written for this run)",
    )
    args = parse(parser, argv)
    from sentence_transformers import SentenceTransformer

    from experiments.common import hub_data
    from moe_embed.data import data_dir
    from moe_embed.evaluation.tasks import DEV_SETS, get_task, load
    from moe_embed.folders import bundled_minilm_path

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = data_dir(args.data_dir) if args.data_dir else hub_data(Path(tmp))
        tasks = candidate_tasks(folder)  # every dataset read before the first model
        sts_dev = load(get_task(*DEV_SETS["stsb-dev"]), folder, purpose="dev set stsb-dev")
        names = [*tasks, "STS-B dev via clustering"]
        print("| model | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
        for path in [bundled_minilm_path(), *args.runs]:
            model = SentenceTransformer(str(path), trust_remote_code=True)
            model.max_seq_length = 64
            rows.append(signals(model, tasks, sts_dev))
            label = "untouched" if path == bundled_minilm_path() else Path(path).name
            print(f"| {label} | " + " | ".join(f"{s:.2f}" for s in rows[-1]) + " |", flush=True)
    return rows


if __name__ == "__main__":
    run_cli(main)
