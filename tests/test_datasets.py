"""Training pairs from published data: JSONL pairs, labelled TSV splits and BEIR qrels (`training/datasets.py`)."""

import json

import pytest
from conftest import FIXTURE_DATA

from moe_embed.usage import UsageError
from training.datasets import load_rows


def test_labelled_split_pairs_texts_of_one_label_with_distinct_positives(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\n" + "".join(f"text {i}\t{'ab'[i % 2]}\n" for i in range(10)) + "alone\tc\n")
    rows = load_rows(path, "labelled")
    label = {f"text {i}": "ab"[i % 2] for i in range(10)}
    assert rows and all(label[r["anchor"]] == label[r["positive"]] and r["anchor"] != r["positive"] for r in rows)
    assert len({r["positive"] for r in rows}) == len(rows)
    assert "alone" not in {r["anchor"] for r in rows}  # its label has no second text
    # the sample is fixed by sample_seed, whatever else is random
    assert load_rows(path, "labelled", max_rows=3) == load_rows(path, "labelled", max_rows=3)
    assert load_rows(path, "labelled", max_rows=3, sample_seed=1) != load_rows(path, "labelled", max_rows=3)
    with pytest.raises(UsageError, match="expected the text column 'sentence'"):
        load_rows(path, "labelled", text="sentence")


def test_beir_pairs_each_query_with_its_judged_documents():
    rows = load_rows(FIXTURE_DATA / "retrieval/scifact", "beir", split="test")
    queries = {
        json.loads(line)["_id"]: json.loads(line)["text"]
        for line in open(FIXTURE_DATA / "retrieval/scifact/queries.jsonl")
    }
    qrels = [
        line.split("\t") for line in open(FIXTURE_DATA / "retrieval/scifact/qrels/test.tsv").read().splitlines()[1:]
    ]
    assert len(rows) == len(qrels) and {r["anchor"] for r in rows} <= set(queries.values())


def test_pairs_keep_their_columns_and_a_cap_draws_distinct_positives(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({"anchor": f"a{i}", "positive": f"p{i % 3}", "negative": "n"}) + "\n" for i in range(9))
    )
    assert len(load_rows(path)) == 9  # as written when no cap is asked for
    capped = load_rows(path, max_rows=5)
    assert len(capped) == 3 and set(capped[0]) == {"anchor", "positive", "negative"}
    with pytest.raises(UsageError, match="unknown dataset format 'csv'"):
        load_rows(path, "csv")
