"""Training pairs from published data (`training/datasets.py`): JSONL pairs, labelled TSV splits and BEIR qrels
on disk, and the same formats from Hub datasets, read through `datasets` from the Hub-layout fixtures of
tests/data exactly as from the Hub."""

import json

import pytest
from conftest import FIXTURE_DATA

from moe_embed.errors import UsageError
from moe_embed.training.config import DatasetSpec
from moe_embed.training.datasets import load_rows, read_rows


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


def _jsonl(path):
    return [json.loads(line) for line in open(path)]


def test_beir_pairs_each_query_with_its_judged_documents_on_disk_and_from_the_hub(tmp_path):
    """A BEIR folder on disk and the same data in mteb's Hub layout give the same pairs."""
    hub = FIXTURE_DATA / "mteb/scifact"
    beir = tmp_path / "scifact"
    (beir / "qrels").mkdir(parents=True)
    corpus = _jsonl(hub / "corpus/corpus.jsonl")
    (beir / "corpus.jsonl").write_text((hub / "corpus/corpus.jsonl").read_text())
    (beir / "queries.jsonl").write_text((hub / "queries/queries.jsonl").read_text())
    qrels = _jsonl(hub / "train.jsonl")
    (beir / "qrels/train.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q['query-id']}\t{q['corpus-id']}\t{q['score']}\n" for q in qrels)
    )
    rows = load_rows(beir, "beir", split="train")
    queries = {q["_id"]: q["text"] for q in _jsonl(hub / "queries/queries.jsonl")}
    documents = {d["_id"]: d for d in corpus}
    assert sorted((r["anchor"], r["positive"]) for r in rows) == sorted(
        (queries[q["query-id"]], f"{documents[q['corpus-id']]['title']} {documents[q['corpus-id']]['text']}")
        for q in qrels
    )
    from_hub = read_rows(DatasetSpec(hub="mteb/scifact", format="beir", split="train"), tmp_path, str(FIXTURE_DATA))
    assert sorted(map(tuple, (r.values() for r in from_hub))) == sorted(map(tuple, (r.values() for r in rows)))


def test_hub_pairs_read_the_parquet_split_in_its_column_order():
    import pyarrow.parquet as pq

    table = pq.read_table(FIXTURE_DATA / "sentence-transformers/all-nli/triplet/train-00000-of-00001.parquet")
    spec = DatasetSpec(hub="sentence-transformers/all-nli", subset="triplet")
    rows = read_rows(spec, FIXTURE_DATA, str(FIXTURE_DATA))
    expected = [dict(zip(("anchor", "positive", "negative"), r.values(), strict=False)) for r in table.to_pylist()]
    assert sorted(rows, key=str) == sorted(expected, key=str) and spec.entry_name() == "all-nli"
    # columns: chosen and ordered by the config (here: the contradiction as the positive)
    swapped = DatasetSpec(
        hub="sentence-transformers/all-nli", subset="triplet", columns=["anchor", "negative"], max_rows=3
    )
    rows = read_rows(swapped, FIXTURE_DATA, str(FIXTURE_DATA))
    negatives = {r["anchor"]: r["negative"] for r in table.to_pylist()}
    assert len(rows) == 3 and all(
        set(r) == {"anchor", "positive"} and negatives[r["anchor"]] == r["positive"] for r in rows
    )
    with pytest.raises(UsageError, match="expected 2 or 3 text columns"):
        read_rows(
            DatasetSpec(hub="sentence-transformers/all-nli", subset="triplet", columns=["anchor", "hypothesis"]),
            FIXTURE_DATA,
            str(FIXTURE_DATA),
        )


def test_hub_labelled_split_pairs_texts_of_one_label():
    import pyarrow.parquet as pq

    train = pq.read_table(FIXTURE_DATA / "mteb/banking77/data/train-00000-of-00001.parquet").to_pydict()
    label = dict(zip(train["text"], train["label"], strict=False))
    rows = read_rows(DatasetSpec(hub="mteb/banking77", format="labelled"), FIXTURE_DATA, str(FIXTURE_DATA))
    assert 3 <= len(rows) <= len(label) and len({r["positive"] for r in rows}) == len(rows)
    assert all(label[r["anchor"]] == label[r["positive"]] and r["anchor"] != r["positive"] for r in rows)


def test_a_hub_dataset_out_of_reach_is_one_line_naming_it_and_the_download(tmp_path):
    spec = DatasetSpec(hub="sentence-transformers/natural-questions")  # no copy in the fixtures; offline
    with pytest.raises(UsageError) as error:
        read_rows(spec, tmp_path, str(FIXTURE_DATA))
    message = str(error.value)
    assert "\n" not in message and "sentence-transformers/natural-questions" in message
    assert "moe-embed data download DIR" in message


def test_a_dataset_names_exactly_one_source():
    with pytest.raises(UsageError, match="exactly one of path or hub"):
        DatasetSpec(path="a.jsonl", hub="sentence-transformers/all-nli")
    with pytest.raises(UsageError, match="exactly one of path or hub"):
        DatasetSpec()
    with pytest.raises(UsageError, match="Hub dataset id"):
        DatasetSpec(hub="all-nli")


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
