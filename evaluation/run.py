"""Evaluate an embedding model on the local MTEB-style suite over `../shared/data`.

    python -m evaluation.run models/mote-minilm --tasks STSBenchmark,SciFact --output results.json
    python -m evaluation.run sentence-transformers/all-MiniLM-L6-v2 --tasks all

Task names follow MTEB's where MTEB has the dataset; clustering tasks marked "(local)" have no
MTEB counterpart. Each task type is encoded with the prompt MoTE's paper maps it to, when the
model defines it: retrieval queries `query` and documents `document`; STS, pair classification
and classification `classification`; clustering `clustering`. Models without prompts get none.
Scores are on a 0-100 scale; `--output` writes `{task: {"main_score": x, "metric": name}}` and a
markdown table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convert.folders import load_sentence_transformer
from evaluation import data as D
from evaluation.data import DATA_DIR_HELP
from evaluation.metrics import classification_accuracy, clustering_v_measure, undersample_draws
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("evaluation")


@dataclass(frozen=True)
class Task:
    """One evaluation task: its type, metric name and data loader (given the data folder)."""

    name: str
    type: str  # sts | retrieval | pair_classification | classification | clustering
    metric: str
    load: Callable[[Path], object]
    samples_per_label: int = 8  # classification: MTEB's per-task training subsample size


TASKS = {
    task.name: task
    for task in [
        Task("STSBenchmark", "sts", "cosine_spearman", lambda r: D.sts_pairs(r / "sts/stsb", ["test.tsv"])),
        Task(
            "SICK-R",
            "sts",
            "cosine_spearman",
            lambda r: D.sts_pairs(r / "sts/sick-r", ["train.tsv", "trial.tsv", "test.tsv"]),
        ),
        Task("SciFact", "retrieval", "ndcg_at_10", lambda r: D.beir(r / "retrieval/scifact")),
        Task(
            "TwitterURLCorpus",
            "pair_classification",
            "max_ap",
            lambda r: D.labelled_pairs(
                r / "pair_classification/twitter_url_corpus", "test.tsv", "sentence1", "sentence2"
            ),
        ),
        Task(
            "Banking77Classification",
            "classification",
            "accuracy",
            lambda r: D.labelled_texts(r / "classification/banking77", "train.tsv", "test.tsv"),
        ),
        Task(
            "EmotionClassification",
            "classification",
            "accuracy",
            lambda r: D.labelled_texts(r / "classification/emotion", "train.tsv", "test.tsv"),
            samples_per_label=16,
        ),
        Task(
            "AmazonCounterfactualClassification",
            "classification",
            "accuracy",
            lambda r: D.labelled_texts(r / "classification/amazon_counterfactual", "en_train.tsv", "en_test.tsv"),
            samples_per_label=32,
        ),
        Task(
            "SST2Classification (local)",
            "classification",
            "accuracy",
            lambda r: D.labelled_texts(r / "classification/sst2", "train.tsv", "test.tsv"),
            samples_per_label=32,
        ),
        Task(
            "Banking77Clustering (local)",
            "clustering",
            "v_measure",
            lambda r: D.labelled_texts(r / "classification/banking77", None, "test.tsv"),
        ),
        Task(
            "TRECClustering (local)",
            "clustering",
            "v_measure",
            lambda r: D.labelled_texts(r / "classification/trec", None, "test.tsv", label="coarse_label"),
        ),
    ]
}

# Prompt name per (task type, role), as MoTE maps unseen task types onto its four tasks.
PROMPTS = {
    ("retrieval", "query"): ("query",),
    ("retrieval", "document"): ("document", "passage", "corpus"),
    ("sts", "text"): ("classification",),
    ("pair_classification", "text"): ("classification",),
    ("classification", "text"): ("classification",),
    ("clustering", "text"): ("clustering",),
}


def prompt_for(model, task_type: str, role: str = "text") -> str:
    """The prompt text the model defines for this task type and role, or ''."""
    for name in PROMPTS[(task_type, role)]:
        if name in (model.prompts or {}):
            return model.prompts[name]
    return ""


def embed(model, texts: list[str], prompt: str, batch_size: int) -> np.ndarray:
    return model.encode(texts, prompt=prompt, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def evaluate(model, task: Task, root: Path, batch_size: int = 64, seed: int = 42) -> float:
    """Main score of `model` on `task`, 0-100."""
    from sentence_transformers.sentence_transformer.evaluation import (
        BinaryClassificationEvaluator,
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )
    from sentence_transformers.util import cos_sim

    data = task.load(root)
    if task.type == "sts":
        prompt = prompt_for(model, "sts")
        evaluator = EmbeddingSimilarityEvaluator(
            [prompt + s for s in data.sentences1],
            [prompt + s for s in data.sentences2],
            data.scores,
            batch_size=batch_size,
            similarity_fn_names=["cosine"],
        )
        return 100 * evaluator(model)["spearman_cosine"]
    if task.type == "pair_classification":
        prompt = prompt_for(model, "pair_classification")
        evaluator = BinaryClassificationEvaluator(
            [prompt + s for s in data.sentences1],
            [prompt + s for s in data.sentences2],
            [int(s) for s in data.scores],
            batch_size=batch_size,
            similarity_fn_names=["cosine", "dot", "euclidean", "manhattan"],
        )
        results = evaluator(model)
        return 100 * max(value for key, value in results.items() if key.endswith("_ap"))
    if task.type == "retrieval":
        evaluator = InformationRetrievalEvaluator(
            data.queries,
            data.corpus,
            data.relevant,
            batch_size=batch_size,
            write_csv=False,
            query_prompt=prompt_for(model, "retrieval", "query"),
            corpus_prompt=prompt_for(model, "retrieval", "document"),
            score_functions={"cosine": cos_sim},
        )
        return 100 * evaluator(model)["cosine_ndcg@10"]
    if task.type == "classification":
        prompt = prompt_for(model, "classification")
        test = embed(model, data.test_texts, prompt, batch_size)
        # mteb 1.12's draws; the experiments read only their undersampled training rows: embed just those
        draws = undersample_draws(data.train_labels, task.samples_per_label, seed=seed)
        used = np.unique(np.concatenate(draws))
        train = np.zeros((len(data.train_texts), test.shape[1]), dtype=test.dtype)
        train[used] = embed(model, [data.train_texts[i] for i in used], prompt, batch_size)
        return 100 * classification_accuracy(train, data.train_labels, test, data.test_labels, seed=seed, draws=draws)
    if task.type == "clustering":
        embeddings = embed(model, data.test_texts, prompt_for(model, "clustering"), batch_size)
        return 100 * clustering_v_measure(embeddings, data.test_labels, seed=seed)
    raise ValueError(f"unknown task type {task.type!r}")


def select_tasks(spec: str) -> list[Task]:
    """Comma-separated task names (or `all`) to tasks; a clear error for unknown names."""
    if spec.strip() == "all":
        return list(TASKS.values())
    names = [name.strip() for name in spec.split(",") if name.strip()]
    unknown = [name for name in names if name not in TASKS]
    if unknown or not names:
        raise UsageError(f"unknown tasks {unknown or spec!r}; expected comma-separated names from: {', '.join(TASKS)}")
    return [TASKS[name] for name in names]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("model", help="model folder or Hub id (loaded with SentenceTransformer)")
    parser.add_argument("--tasks", default="all", help=f"comma-separated task names or 'all': {', '.join(TASKS)}")
    parser.add_argument("--output", default=None, help="JSON file to write the scores to")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--seed", type=int, default=42, help="seed of the classification and clustering protocols")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow the model folder's own code (MoTE, MoE)"
    )
    args = parser.parse_args(argv)
    tasks = select_tasks(args.tasks)
    root = D.data_dir(args.data_dir)

    model = load_sentence_transformer(args.model, trust_remote_code=args.trust_remote_code)
    results = {}
    for task in tasks:
        logger.info("evaluating %s", task.name)
        score = evaluate(model, task, root, args.batch_size, args.seed)
        results[task.name] = {"main_score": round(score, 4), "metric": task.metric}
        logger.info("%s: %.2f (%s)", task.name, score, task.metric)
    print("| task | type | metric | score |\n|---|---|---|---:|")
    for task in tasks:
        print(f"| {task.name} | {task.type} | {task.metric} | {results[task.name]['main_score']:.2f} |")
    if args.output:
        Path(args.output).write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    run_cli(main)
