"""Can a development set that is not a test split see the recipe's Banking77-clustering loss?

    python -m experiments.dev_signals models/forgetting/runs/route+experts+distill+dev+lr1e-4-s{0,1,2}

Per-expert checkpoint selection (each expert keeps its own best step) can only protect a held-out task when
some dev set moves with it. This scores, for the untouched MiniLM and each given run, candidate dev sets for
the clustering expert, each through the clustering prompt, at the recipe's training length (64 tokens):
V-measure of Emotion validation (6 emotions), SST-2 dev (2 labels) and TREC train (50 fine labels; the
recipe trains on 600 of its 5452 rows), and STS-B dev (Spearman). Banking77 itself (train split) is left
out: selecting on it would make Banking77 clustering no longer held out.
"""

from __future__ import annotations

from pathlib import Path

from evaluation.run import Task, evaluate
from moe_embed import data as D
from moe_embed.data import DATA_DIR_HELP, data_dir
from moe_embed.usage import command_parser, parse, run_cli
from training.dev import DEV_TASKS

CANDIDATES = [
    Task(
        "Emotion val",
        "clustering",
        "v_measure",
        lambda r: D.labelled_texts(r / "classification/emotion", None, "validation.tsv"),
    ),
    Task(
        "SST-2 dev", "clustering", "v_measure", lambda r: D.labelled_texts(r / "classification/sst2", None, "dev.tsv")
    ),
    Task(
        "TREC train (fine)",
        "clustering",
        "v_measure",
        lambda r: D.labelled_texts(r / "classification/trec", None, "train.tsv", label="fine_label"),
    ),
]


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    from sentence_transformers import SentenceTransformer

    from moe_embed.folders import bundled_minilm_path

    parser = command_parser(__doc__, prog)
    parser.add_argument("runs", nargs="+", help="trained MoTE folders")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    args = parse(parser, argv)
    root = data_dir(args.data_dir)
    names = [task.name for task in CANDIDATES] + ["STS-B dev via clustering"]
    print("| model | " + " | ".join(names) + " |\n|---|" + "---:|" * len(names))
    for path in [bundled_minilm_path(), *args.runs]:
        model = SentenceTransformer(str(path), trust_remote_code=True)
        model.max_seq_length = 64
        scores = [evaluate(model, task, task.load(root)) for task in CANDIDATES]
        if "clustering" in (model.prompts or {}):  # STS-B dev scored through the clustering expert
            model.prompts = {**model.prompts, "classification": model.prompts["clustering"]}
        scores.append(evaluate(model, DEV_TASKS["stsb-dev"], DEV_TASKS["stsb-dev"].load(root)))
        label = "untouched" if path == bundled_minilm_path() else Path(path).name
        print(f"| {label} | " + " | ".join(f"{s:.2f}" for s in scores) + " |", flush=True)


if __name__ == "__main__":
    run_cli(main)
