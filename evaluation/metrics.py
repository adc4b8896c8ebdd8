"""Metrics not covered by sentence-transformers' evaluators: MTEB's classification and clustering
protocols, and an nDCG@k used to cross-check the retrieval evaluator in tests."""

from __future__ import annotations

import math

import numpy as np


def undersample(labels: list, samples_per_label: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of at most `samples_per_label` examples per label, drawn in a shuffled order (MTEB)."""
    order = rng.permutation(len(labels))
    counts: dict = {}
    chosen = []
    for index in order:
        label = labels[index]
        if counts.get(label, 0) < samples_per_label:
            counts[label] = counts.get(label, 0) + 1
            chosen.append(index)
    return np.asarray(chosen)


def undersample_draws(labels: list, samples_per_label: int, n_experiments: int = 10, seed: int = 42) -> list[np.ndarray]:
    """The training indices of each of MTEB's `n_experiments` classification experiments."""
    rng = np.random.default_rng(seed)
    return [undersample(labels, samples_per_label, rng) for _ in range(n_experiments)]


def classification_accuracy(
    train_embeddings: np.ndarray,
    train_labels: list,
    test_embeddings: np.ndarray,
    test_labels: list,
    n_experiments: int = 10,
    samples_per_label: int = 8,
    max_iter: int = 100,
    seed: int = 42,
    draws: list[np.ndarray] | None = None,
) -> float:
    """Mean test accuracy of logistic regressions fitted on `n_experiments` undersampled training sets.

    `draws` are the experiments' training indices (default: `undersample_draws` with these
    arguments). Only those rows of `train_embeddings` are read, so a caller that passes its draws
    may embed just those rows and leave the others empty.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score

    scores = []
    if draws is None:
        draws = undersample_draws(train_labels, samples_per_label, n_experiments, seed)
    for index in draws:
        classifier = LogisticRegression(max_iter=max_iter, random_state=seed)
        classifier.fit(train_embeddings[index], np.asarray(train_labels)[index])
        scores.append(accuracy_score(test_labels, classifier.predict(test_embeddings)))
    return float(np.mean(scores))


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
