"""Training pairs from the data as it is published: a dataset of a training config has a `format`.

- `pairs`: JSONL with `anchor`, `positive` and optionally `negative` (as `training.data_tools` writes).
- `labelled`: a TSV with a text and a label column (a classification or clustering train split); each
  sampled text is paired with another text of its label.
- `beir`: a BEIR folder (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`); each query is paired with
  a document judged relevant in `split`.

`max_rows` keeps that many rows, drawn with `sample_seed` (fixed by default, so that runs with different
training seeds train on the same rows) and with pairwise different positives: a positive that repeats
within a dataset would be an in-batch false negative of the contrastive loss.
"""

from __future__ import annotations

import random
from pathlib import Path

from moe_embed.usage import UsageError

FORMATS = ("pairs", "labelled", "beir")


def distinct_positives(rows: list[dict], cap: int | None, rng: random.Random) -> list[dict]:
    """Up to `cap` rows in random order, no two with the same positive."""
    seen, kept = set(), []
    for row in rng.sample(rows, len(rows)):
        if row["positive"] not in seen:
            seen.add(row["positive"])
            kept.append(row)
            if cap is not None and len(kept) == cap:
                break
    return kept


def same_label_pairs(texts: list[str], labels: list[str], rng: random.Random) -> list[dict]:
    """Each text (whose label has another text) with another text of its label, in random order."""
    by_label: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    rows = []
    for index in rng.sample(range(len(texts)), len(texts)):
        others = [j for j in by_label[labels[index]] if j != index] if len(by_label[labels[index]]) > 1 else []
        if others:
            rows.append({"anchor": texts[index], "positive": texts[rng.choice(others)]})
    return rows


def labelled_rows(path: Path, text: str, label: str, rng: random.Random) -> list[dict]:
    from moe_embed.data import read_tsv

    table = read_tsv(path)
    if table and (text not in table[0] or label not in table[0]):
        raise UsageError(f"{path} has columns {list(table[0])}; expected the text column {text!r} and label {label!r}")
    table = [row for row in table if row[label] != ""]
    return same_label_pairs([row[text] for row in table], [row[label] for row in table], rng)


def beir_rows(path: Path, split: str) -> list[dict]:
    from moe_embed.data import beir, read_jsonl

    data = beir(path, split=split)
    queries = {q["_id"]: q["text"] for q in read_jsonl(path / "queries.jsonl")}
    return [
        {"anchor": queries[query], "positive": data.corpus[doc]}
        for query, docs in sorted(data.relevant.items())
        for doc in sorted(docs)
        if doc in data.corpus
    ]


def load_rows(path: Path, format: str = "pairs", *, text: str = "text", label: str = "label", split: str = "train",
              max_rows: int | None = None, sample_seed: int = 0) -> list[dict]:  # fmt: skip
    """The training rows of one dataset (see the module docstring)."""
    from training.data_tools import read_pairs

    rng = random.Random(sample_seed)
    if format == "pairs":
        rows = read_pairs(path)
        return rows if max_rows is None else distinct_positives(rows, max_rows, rng)
    if format == "labelled":
        rows = labelled_rows(path, text, label, rng)
    elif format == "beir":
        if not path.is_dir():
            raise UsageError(f"{path} is not a BEIR folder (corpus.jsonl, queries.jsonl, qrels/)")
        rows = beir_rows(path, split)
    else:
        raise UsageError(f"unknown dataset format {format!r}; expected one of {', '.join(FORMATS)}")
    rows = distinct_positives(rows, max_rows, rng)
    if not rows:
        raise UsageError(f"{path} gives no training pairs ({format})")
    return rows


__all__ = ["FORMATS", "load_rows", "distinct_positives", "same_label_pairs"]
