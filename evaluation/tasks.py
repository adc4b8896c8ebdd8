"""The evaluation suite as mteb tasks, read from the Hub or from a data folder's local copies.

Seven tasks are mteb's own (`mteb.get_task`). Three have no mteb task and are defined here on mteb's task
classes, so mteb's evaluators score them too: SST-2 classification, and Banking77 and TREC clustering with
mteb's single-set clustering protocol (`AbsTaskClusteringLegacy`: one mini-batch k-means over the whole
test split). A task reads its data through `moe_embed.data.reading`: from the data folder's copy of its Hub
dataset when there is one, else from the Hub; offline with neither, it stops in one line.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

from moe_embed.data import CATALOGUE, reading

# the suite's tasks, in the order of their tables, with their mteb task types (tests/test_mteb.py checks them
# against mteb's metadata; kept here so that command lines list them without importing mteb)
SUITE = {
    "STSBenchmark": "STS",
    "SICK-R": "STS",
    "SciFact": "Retrieval",
    "TwitterURLCorpus": "PairClassification",
    "Banking77Classification": "Classification",
    "EmotionClassification": "Classification",
    "AmazonCounterfactualClassification": "Classification",
    "SST2Classification": "Classification",
    "Banking77Clustering": "Clustering",
    "TRECClustering": "Clustering",
}
# the subsets read where a task has several
SUBSETS = {"AmazonCounterfactualClassification": ["en"]}
# the split scored where mteb scores several (AmazonCounterfactual: validation and test; the suite reports test)
SPLITS = {"AmazonCounterfactualClassification": "test"}

# development sets: a task scored on a split the suite does not report (checkpoint selection, calibration)
DEV_SETS = {"stsb-dev": ("STSBenchmark", "validation"), "scifact-train": ("SciFact", "train")}


def _describe(name: str, repo: str, kind: str, score: str, splits: list[str], description: str):
    """mteb's `TaskMetadata` of a suite task that mteb lacks (English text, data from `repo` at its pinned
    revision)."""
    from mteb.abstasks.task_metadata import TaskMetadata

    return TaskMetadata(
        name=name,
        description=description,
        dataset={"path": repo, "revision": CATALOGUE[repo].revision or "main"},
        type=kind,
        category="t2c",
        modalities=["text"],
        eval_splits=splits,
        eval_langs=["eng-Latn"],
        main_score=score,
    )


def _one_set_clustering() -> type:
    """mteb's legacy clustering task (one mini-batch k-means over a set) on a test split's texts as one set,
    clustered by `label_source`: mteb's legacy protocol reads a row of lists per set."""
    from datasets import Dataset, DatasetDict
    from mteb.abstasks.clustering_legacy import AbsTaskClusteringLegacy

    class OneSetClustering(AbsTaskClusteringLegacy):
        """The test split's texts as one set to cluster by `label_source`."""

        label_source = "label"

        def dataset_transform(self, num_proc: int | None = None, **kwargs) -> None:
            self.dataset = DatasetDict(
                {
                    split: Dataset.from_dict(
                        {
                            "sentences": [list(self.dataset[split]["text"])],
                            "labels": [list(self.dataset[split][self.label_source])],
                        }
                    )
                    for split in self.metadata.eval_splits
                }
            )

    return OneSetClustering


def _custom_tasks() -> dict[str, type]:
    """The suite's tasks that mteb lacks, on mteb's task classes (built on first use: importing mteb is slow)."""
    from mteb.abstasks import AbsTaskClassification

    class SST2Classification(AbsTaskClassification):
        samples_per_label = 32
        input_column_name = "sentence"
        metadata = _describe(
            "SST2Classification",
            "stanfordnlp/sst2",
            "Classification",
            "accuracy",
            ["validation"],
            "Sentence polarity (SST-2): classifiers fit on the phrase-level GLUE train split, scored on the "
            "validation sentences (the test split's labels are not public).",
        )

    one_set_clustering = _one_set_clustering()

    class Banking77Clustering(one_set_clustering):
        metadata = _describe(
            "Banking77Clustering",
            "mteb/banking77",
            "Clustering",
            "v_measure",
            ["test"],
            "Banking77's test queries clustered by their 77 intents.",
        )

    class TRECClustering(one_set_clustering):
        label_source = "coarse_label"
        metadata = _describe(
            "TRECClustering",
            "CogComp/trec",
            "Clustering",
            "v_measure",
            ["test"],
            "TREC question classification's test questions clustered by their 6 coarse classes.",
        )

    return {task.metadata.name: task for task in (SST2Classification, Banking77Clustering, TRECClustering)}


def quiet_mteb() -> None:
    """mteb's warnings for every run (superseded tasks, prompt names it does not know) go to --verbose."""
    if not logging.getLogger().isEnabledFor(logging.INFO):
        import datasets

        logging.getLogger("mteb").setLevel(logging.ERROR)
        datasets.disable_progress_bars()


def get_task(name: str, split: str | None = None):
    """The mteb task `name` of the suite (or any mteb task), scored on `split` (default: its own)."""
    import mteb

    quiet_mteb()
    custom = _custom_tasks()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "superseded by ..." for STSBenchmark, Banking77Classification, Emotion
        task = custom[name]() if name in custom else mteb.get_task(name, hf_subsets=SUBSETS.get(name))
    split = split or SPLITS.get(name)
    if split:  # a per-task copy of the metadata: the class's own keeps its splits
        task.metadata = task.metadata.model_copy(update={"eval_splits": [split]})
    return task


def repo_of(task) -> str:
    """The Hub dataset `task` reads (also once `load` has pointed it at a local copy)."""
    return getattr(task, "hub_id", None) or task.metadata.dataset["path"]


class _ListColumns:
    """A `datasets.Dataset` whose columns read as lists: mteb's classification draws (`_undersample_data`) read
    the label column row by row, and a `datasets` 4+ column is lazy, so each row read copies a table (SST-2's
    67,349 train rows, 10 draws: 85% of its evaluation time under cProfile). The same draws, read once."""

    def __init__(self, dataset):
        self._dataset, self._columns = dataset, {}

    def __getitem__(self, key):
        if isinstance(key, str):
            return self._columns.setdefault(key, list(self._dataset[key]))
        return self._dataset[key]

    def __len__(self):
        return len(self._dataset)

    def __getattr__(self, name):
        return getattr(self._dataset, name)


def _draw_from_lists(task) -> None:
    """Give this classification task's mteb draws `_ListColumns` (this object only; mteb's class is untouched)."""
    draw = task._undersample_data  # mteb's own method, bound to the task
    task._undersample_data = lambda dataset, *args, **kwargs: draw(_ListColumns(dataset), *args, **kwargs)


def load(task, folder: Path | None, purpose: str = ""):
    """Read `task`'s data now (from the data folder's copy of its dataset, else the Hub), so a missing dataset
    stops the run before any model is loaded; mteb then keeps the data for every evaluation of the task."""
    task.hub_id = repo_of(task)  # the metadata may point at a local copy below; results name the Hub dataset
    with reading(task.hub_id, folder, purpose=purpose or task.metadata.name) as local:
        if local is not None:  # a per-task copy of the metadata: the class's own stays pointed at the Hub
            dataset = {**task.metadata.dataset, "path": str(local)}
            task.metadata = task.metadata.model_copy(update={"dataset": dataset})
        task.load_data()
    if hasattr(task, "_undersample_data"):
        _draw_from_lists(task)
    return task


def run(model, task, batch_size: int = 64):
    """mteb's `TaskResult` of `model` (a SentenceTransformer) on `task` (loaded): mteb's evaluator, no results
    cache, no emissions tracking, errors raised."""
    import mteb

    quiet_mteb()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # renamed sentence-transformers methods mteb calls; superseded tasks
        result = mteb.evaluate(
            model,
            task,
            cache=None,
            overwrite_strategy="always",
            show_progress_bar=False,
            encode_kwargs={"batch_size": batch_size, "show_progress_bar": False},
            co2_tracker=False,
            raise_error=True,
        )
    return result.task_results[0]


def score(model, task, batch_size: int = 64) -> float:
    """`task`'s main score for `model` on its evaluation split, 0-100, by mteb."""
    return 100 * run(model, task, batch_size).get_score(splits=task.metadata.eval_splits)


__all__ = ["SUITE", "DEV_SETS", "get_task", "load", "repo_of", "run", "score"]
