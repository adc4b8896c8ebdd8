"""Evaluate an embedding model on the local MTEB-style suite over the data folder.

    moe-embed evaluate models/mote-minilm --trust-remote-code --tasks STSBenchmark,SciFact --output results.json
    moe-embed evaluate sentence-transformers/all-MiniLM-L6-v2 --tasks all

(`python -m evaluation.run ...` is the same command.)
Task names follow MTEB's where MTEB has the dataset; clustering tasks marked "(local)" have no
MTEB counterpart. Each task type is encoded with the prompt MoTE's paper maps it to, when the
model defines it: retrieval queries `query` and documents `document`; STS, pair classification
and classification `classification`; clustering `clustering`. Models without prompts get none.
Scores are on a 0-100 scale; `--output` writes `{task: {"main_score": x, "metric": name}}`, again after
every task (a stopped run keeps what it scored), and a markdown table goes to stdout. Every task's data is
read before the model is loaded, so a missing file is reported at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modeling.defaults import TASK_NAME_ALIASES, TASK_TYPE_EXPERTS
from moe_embed import data as D
from moe_embed.data import DATA_DIR_HELP
from moe_embed.usage import UsageError, command_parser, parse, run_cli

logger = logging.getLogger(__name__)


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


def prompt_for(model, task_type: str, role: str = "text") -> str:
    """The prompt the model defines for the MoTE task that serves this task type and role (`TASK_TYPE_EXPERTS`,
    e.g. STS -> classification, retrieval documents -> document), under the task's name or one of its other
    names (`passage`, `corpus`), or ''."""
    task = TASK_TYPE_EXPERTS[task_type if role == "text" else f"{task_type}_{role}"]
    names = [task, *(alias for alias, target in TASK_NAME_ALIASES.items() if target == task)]
    return next((model.prompts[name] for name in names if name in (model.prompts or {})), "")


def embed(model, texts: list[str], prompt: str, batch_size: int):
    return model.encode(texts, prompt=prompt, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def evaluate(model, task: Task, data, batch_size: int = 64, seed: int = 42) -> float:
    """Main score of `model` on `task`, 0-100; `data` is `task.load(data folder)`."""
    import numpy as np
    from sentence_transformers.sentence_transformer.evaluation import (
        BinaryClassificationEvaluator,
        EmbeddingSimilarityEvaluator,
        InformationRetrievalEvaluator,
    )
    from sentence_transformers.util import cos_sim

    from evaluation.metrics import classification_accuracy, clustering_v_measure, undersample_draws

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


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog)
    parser.add_argument("model", help="model folder or Hub id (loaded with SentenceTransformer)")
    parser.add_argument("--tasks", default="all", help=f"comma-separated task names or 'all': {', '.join(TASKS)}")
    parser.add_argument("--output", help="JSON file to write the scores to (written again after every task)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--seed", type=int, default=42, help="seed of the classification and clustering protocols")
    parser.add_argument(
        "--trust-remote-code", action="store_true", help="allow the model folder's own code (MoTE, MoE, CoMoE, AEA)"
    )
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    from moe_embed.files import atomic_write_text
    from moe_embed.folders import check_output, load_sentence_transformer, open_model_folder

    args = parse(build_parser(prog), argv)
    tasks = select_tasks(args.tasks)
    # every input checked before the long steps: the model folder, the data of every task, the output
    folder = open_model_folder(args.model, trust_remote_code=args.trust_remote_code)
    root = D.data_dir(args.data_dir)
    data = {task.name: task.load(root) for task in tasks}
    if args.output:
        check_output(args.output, overwrite=args.overwrite)
    model = load_sentence_transformer(folder.path, trust_remote_code=args.trust_remote_code)
    results = {}
    for task in tasks:
        logger.info("evaluating %s", task.name)
        score = evaluate(model, task, data[task.name], args.batch_size, args.seed)
        results[task.name] = {"main_score": round(score, 4), "metric": task.metric}
        logger.info("%s: %.2f (%s)", task.name, score, task.metric)
        if args.output:  # what is scored is kept, whatever happens to the next task
            atomic_write_text(args.output, json.dumps(results, indent=2) + "\n", overwrite=True)
    print("| task | type | metric | score |\n|---|---|---|---:|")
    for task in tasks:
        print(f"| {task.name} | {task.type} | {task.metric} | {results[task.name]['main_score']:.2f} |")
    return results


if __name__ == "__main__":
    run_cli(main)
