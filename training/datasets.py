"""Training pairs from the data as it is published: a dataset of a training config is a local file (`path`) or
a Hub dataset (`hub`, read with `datasets.load_dataset` through `moe_embed.data.load`: from the data folder's
copy when it has one, else the Hub and its cache), and has a `format`.

- `pairs`: rows with `anchor`, `positive` and optionally `negative`: a JSONL file (as `moe_embed.training.data_tools`
  writes), or a Hub split whose `columns` (default: its columns in order) are taken as those three.
- `labelled`: a text and a label column (a classification or clustering train split: a TSV, or a Hub split);
  each sampled text is paired with another text of its label.
- `beir`: a BEIR folder (`corpus.jsonl`, `queries.jsonl`, `qrels/<split>.tsv`), or a Hub dataset in mteb's
  retrieval layout (subsets `corpus`, `queries` and the qrels' `default`); each query is paired with a
  document judged relevant in `split`.

`max_rows` keeps that many rows, drawn with `sample_seed` (fixed by default, so that runs with different
training seeds train on the same rows) and with pairwise different positives: a positive that repeats
within a dataset would be an in-batch false negative of the contrastive loss.
"""

from __future__ import annotations

import random
from pathlib import Path

from moe_embed.errors import UsageError
from moe_embed.readers import corpus_texts

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
    from moe_embed.readers import read_tsv

    table = read_tsv(path)
    if table and (text not in table[0] or label not in table[0]):
        raise UsageError(f"{path} has columns {list(table[0])}; expected the text column {text!r} and label {label!r}")
    table = [row for row in table if row[label] != ""]
    return same_label_pairs([row[text] for row in table], [row[label] for row in table], rng)


def beir_rows(path: Path, split: str) -> list[dict]:
    from moe_embed.readers import beir, read_jsonl

    data = beir(path, split=split)
    queries = {q["_id"]: q["text"] for q in read_jsonl(path / "queries.jsonl")}
    return [
        {"anchor": queries[query], "positive": data.corpus[doc]}
        for query, docs in sorted(data.relevant.items())
        for doc in sorted(docs)
        if doc in data.corpus
    ]


def hub_rows(spec, data_dir: str | None, rng: random.Random) -> list[dict]:
    """The training rows of a Hub dataset `spec` (a `moe_embed.training.config.DatasetSpec` with `hub`), uncapped; `rng`
    pairs a labelled split's texts."""
    from moe_embed import data as D

    folder = D.data_dir(data_dir)

    def table(subset, split):
        return D.load(spec.hub, subset, split, revision=spec.revision, folder=folder, purpose=spec.entry_name())

    if spec.format == "beir":
        corpus = table("corpus", "corpus")
        documents = dict(zip(corpus["_id"], corpus_texts(corpus), strict=True))
        queries = table("queries", "queries")
        questions = dict(zip(queries["_id"], queries["text"], strict=False))
        qrels = table(spec.subset or "default", spec.split)
        judged = sorted(
            {
                (str(q), str(d))
                for q, d, s in zip(qrels["query-id"], qrels["corpus-id"], qrels["score"], strict=False)
                if s > 0
            }
        )
        return [
            {"anchor": questions[q], "positive": documents[d]} for q, d in judged if q in questions and d in documents
        ]
    data = table(spec.subset, spec.split)
    where = f"{spec.hub} ({spec.subset or 'default'}, {spec.split})"
    if spec.format == "labelled":
        if spec.text not in data.column_names or spec.label not in data.column_names:
            raise UsageError(
                f"{where} has columns {data.column_names}; expected the text column {spec.text!r} and label "
                f"{spec.label!r}"
            )
        kept = [
            (t, y) for t, y in zip(data[spec.text], data[spec.label], strict=False) if t and y is not None and y != ""
        ]
        return same_label_pairs([t for t, _ in kept], [y for _, y in kept], rng)
    columns = spec.columns or [c for c in data.column_names if c not in ("label", "score")]
    missing = [c for c in columns if c not in data.column_names]
    if missing or not 2 <= len(columns) <= 3:
        problem = f"no column {missing}" if missing else f"{len(columns)} text columns"
        raise UsageError(
            f"{where} has columns {data.column_names}, {problem}; expected 2 or 3 text columns (anchor, "
            f"positive[, negative]): name them with columns: [...]"
        )
    names = ("anchor", "positive", "negative")[: len(columns)]
    return [dict(zip(names, values, strict=False)) for values in zip(*(data[c] for c in columns), strict=False)]


def dataset_path(spec, base: Path, data_dir: str | None = None) -> Path:
    """Where a local dataset is: `{data}/...` in the data folder (`data_dir`, else `$MOE_EMBED_DATA`), a relative
    path under `base`, or the absolute path."""
    if spec.path.startswith("{data}/"):
        from moe_embed.data import data_dir as find_data_dir

        folder = find_data_dir(data_dir)
        if folder is None:
            raise UsageError(f"{spec.path} names the data folder: pass --data-dir DIR (or set $MOE_EMBED_DATA)")
        return folder / spec.path.removeprefix("{data}/")
    return Path(spec.path) if Path(spec.path).is_absolute() else (base / spec.path).resolve()


def read_rows(spec, base: Path, data_dir: str | None = None) -> list[dict]:
    """The training rows of the dataset `spec` of a training config (local or Hub), sampled as it asks."""
    if spec.hub is None:
        return load_rows(dataset_path(spec, base, data_dir), spec.format, text=spec.text, label=spec.label,
                         split=spec.split, max_rows=spec.max_rows, sample_seed=spec.sample_seed)  # fmt: skip
    rng = random.Random(spec.sample_seed)  # drawn from as `load_rows` draws: a copy of a file gives its rows
    rows = hub_rows(spec, data_dir, rng)
    if spec.format != "pairs" or spec.max_rows is not None:
        rows = distinct_positives(rows, spec.max_rows, rng)
    if not rows:
        raise UsageError(f"{spec.hub} gives no training pairs ({spec.format}, split {spec.split})")
    return rows


def load_rows(path: Path, format: str = "pairs", *, text: str = "text", label: str = "label", split: str = "train",
              max_rows: int | None = None, sample_seed: int = 0) -> list[dict]:  # fmt: skip
    """The training rows of one dataset (see the module docstring)."""
    from moe_embed.training.data_tools import read_pairs

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


__all__ = ["FORMATS", "read_rows", "hub_rows", "load_rows", "distinct_positives", "same_label_pairs"]
