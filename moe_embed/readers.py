"""Readers of local data files: the formats a training config's `path:` datasets come in (JSONL pairs,
labelled TSV, BEIR folders), the text files the tools take (`--texts`), and the layout of the development
data in `../shared/data` (its README describes it), which the experiments read.

Hub datasets and local copies of them are read through `datasets` instead (`moe_embed.data`).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

from moe_embed.errors import UsageError


def read_tsv(path: Path) -> list[dict[str, str]]:
    """Rows of a headed, tab-separated file without quoting."""
    try:
        with open(path, encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
    except FileNotFoundError:
        raise UsageError(f"missing data file {path}") from None


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a JSON-lines file."""
    try:
        with open(path, encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]
    except FileNotFoundError:
        raise UsageError(f"missing data file {path}") from None


@dataclass
class PairData:
    """Sentence pairs with a score (STS) or a 0/1 label (pair classification)."""

    sentences1: list[str]
    sentences2: list[str]
    scores: list[float]


@dataclass
class LabelledTexts:
    """Texts with labels: train/test for classification, test only for clustering."""

    train_texts: list[str] = field(default_factory=list)
    train_labels: list[str] = field(default_factory=list)
    test_texts: list[str] = field(default_factory=list)
    test_labels: list[str] = field(default_factory=list)


@dataclass
class RetrievalData:
    """BEIR layout: queries, corpus (title + text) and relevant documents per query."""

    queries: dict[str, str]
    corpus: dict[str, str]
    relevant: dict[str, set[str]]


def sts_pairs(root: Path, files: list[str]) -> PairData:
    rows = [row for name in files for row in read_tsv(root / name)]
    return PairData([r["sentence1"] for r in rows], [r["sentence2"] for r in rows], [float(r["score"]) for r in rows])


def labelled_pairs(root: Path, name: str, first: str, second: str) -> PairData:
    rows = [r for r in read_tsv(root / name) if r["label"] != ""]  # TwitterURL: n = 3 votes is unlabelled
    return PairData([r[first] for r in rows], [r[second] for r in rows], [float(r["label"]) for r in rows])


def labelled_texts(root: Path, train: str | None, test: str, label: str = "label") -> LabelledTexts:
    data = LabelledTexts()
    if train is not None:
        rows = read_tsv(root / train)
        data.train_texts, data.train_labels = [r["text"] for r in rows], [r[label] for r in rows]
    rows = read_tsv(root / test)
    data.test_texts, data.test_labels = [r["text"] for r in rows], [r[label] for r in rows]
    return data


def corpus_texts(corpus) -> list[str]:
    """A retrieval corpus's documents as BEIR and mteb embed them: `title + " " + text` (no title: the text).
    `corpus`: rows with `title` and `text` (a `datasets.Dataset` or a list of dicts)."""
    return [f"{row.get('title') or ''} {row['text']}".strip() for row in corpus]


def beir(root: Path, split: str = "test") -> RetrievalData:
    rows = read_jsonl(root / "corpus.jsonl")
    corpus = dict(zip((d["_id"] for d in rows), corpus_texts(rows), strict=True))
    relevant: dict[str, set[str]] = {}
    for row in read_tsv(root / "qrels" / f"{split}.tsv"):
        if float(row["score"]) > 0:
            relevant.setdefault(row["query-id"], set()).add(row["corpus-id"])
    queries = {q["_id"]: q["text"] for q in read_jsonl(root / "queries.jsonl") if q["_id"] in relevant}
    return RetrievalData(queries, corpus, relevant)


def read_texts(path: Path, option: str = "--texts") -> list[str]:
    """The texts of a file, one per line (blank lines skipped); a `UsageError` naming the command's `option`
    when the file cannot be read or holds no text."""
    try:
        texts = [line.strip() for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
    except OSError as error:
        raise UsageError(f"cannot read {option} {path}: {error.strerror}") from None
    if not texts:
        raise UsageError(f"{option} {path} holds no text (one text per line expected)")
    return texts
