"""Metrics not covered by sentence-transformers' evaluators: MTEB's classification and clustering
protocols, and an nDCG@k used to cross-check the retrieval evaluator in tests."""

from __future__ import annotations

import math

import numpy as np


def undersample(labels: list, samples_per_label: int, order: np.ndarray) -> np.ndarray:
    """Indices of the first `samples_per_label` examples of each label, visiting the rows in `order`."""
    counts: dict = {}
    chosen = []
    for index in order:
        label = labels[index]
        if counts.get(label, 0) < samples_per_label:
            counts[label] = counts.get(label, 0) + 1
            chosen.append(index)
    return np.asarray(chosen, dtype=np.int64)


def undersample_draws(
    labels: list, samples_per_label: int, n_experiments: int = 10, seed: int = 42
) -> list[np.ndarray]:
    """The training indices of each of MTEB's `n_experiments` classification experiments, drawn as mteb 1.12 does.

    mteb keeps one index array per evaluation and shuffles it in place before every experiment with
    NumPy's legacy global generator, which has just been reseeded with `seed` (by the task's
    constructor before the first experiment, by each experiment's evaluator before the next). Every
    experiment therefore applies the same permutation again to the previous experiment's order; each
    draw then takes the first `samples_per_label` rows of every label in that order. Here the
    permutation comes from a local `RandomState(seed)` (the same MT19937 stream as
    `np.random.seed(seed)`), so NumPy's global state is neither read nor changed.
    """
    # shuffling any array of this length moves its items by this permutation
    permutation = np.random.RandomState(seed).permutation(len(labels))
    order = np.arange(len(labels))
    draws = []
    for _ in range(n_experiments):
        order = order[permutation]
        draws.append(undersample(labels, samples_per_label, order))
    return draws


def classification_experiment_accuracies(
    train_embeddings: np.ndarray,
    train_labels: list,
    test_embeddings: np.ndarray,
    test_labels: list,
    n_experiments: int = 10,
    samples_per_label: int = 8,
    max_iter: int = 100,
    seed: int = 42,
    draws: list[np.ndarray] | None = None,
) -> list[float]:
    """Test accuracy of each experiment's logistic regression, fitted on its undersampled training rows.

    As mteb 1.12's logRegClassificationEvaluator: scikit-learn's default (lbfgs) logistic regression
    with `max_iter=100` and `random_state=seed`, fitted on the drawn rows in draw order. `draws` are
    the experiments' training indices (default: `undersample_draws` with these arguments). Only those
    rows of `train_embeddings` are read, so a caller that passes its draws may embed just those rows
    and leave the others empty.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score

    if draws is None:
        draws = undersample_draws(train_labels, samples_per_label, n_experiments, seed)
    labels = np.asarray(train_labels)
    scores = []
    for index in draws:
        classifier = LogisticRegression(max_iter=max_iter, random_state=seed)
        classifier.fit(train_embeddings[index], labels[index])
        scores.append(float(accuracy_score(test_labels, classifier.predict(test_embeddings))))
    return scores


def classification_accuracy(*args, **kwargs) -> float:
    """MTEB's classification score: the mean of `classification_experiment_accuracies(*args, **kwargs)`."""
    return float(np.mean(classification_experiment_accuracies(*args, **kwargs)))


def clustering_v_measure(embeddings: np.ndarray, labels: list, n_runs: int = 10, seed: int = 42) -> float:
    """Mean V-measure of mini-batch k-means (k = number of labels) over `n_runs` seeds."""
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import v_measure_score

    k = len(set(labels))
    scores = []
    for run in range(n_runs):
        kmeans = MiniBatchKMeans(n_clusters=k, batch_size=500, n_init="auto", random_state=seed + run)
        scores.append(v_measure_score(labels, kmeans.fit_predict(embeddings)))
    return float(np.mean(scores))


def ndcg_at_k(ranked: list[str], relevant: set[str], k: int = 10) -> float:
    """nDCG@k with binary relevance (the BEIR/MTEB definition)."""
    dcg = sum(1.0 / math.log2(rank + 2) for rank, doc in enumerate(ranked[:k]) if doc in relevant)
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(relevant), k)))
    return dcg / ideal if ideal else 0.0
