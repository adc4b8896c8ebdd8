"""moe_embed.training.data_tools: hard-negative mining with the positive-aware margin, consistency filtering, embedded
through `moe-embed embed` and searched with faiss."""

import json

import numpy as np
import pytest
from sentence_transformers import SentenceTransformer

from moe_embed.errors import run_cli
from moe_embed.training.data_tools import consistency_keep, main, positive_index

PAIRS = [
    {"anchor": "what do cats eat", "positive": "Cats eat meat and fish."},
    {"anchor": "capital of france", "positive": "Paris is the capital of France."},
    {"anchor": "how tall is everest", "positive": "Mount Everest is 8,849 metres tall."},
    {"anchor": "who wrote hamlet", "positive": "Hamlet was written by Shakespeare."},
    {"anchor": "what do dogs eat", "positive": "Dogs eat meat and kibble."},
    {"anchor": "capital of germany", "positive": "Berlin is the capital of Germany."},
    # near-duplicates: each one's positive is a hard, possibly false, negative for the other
    {"anchor": "which city is the capital of france", "positive": "The French capital is the city of Paris."},
    {"anchor": "what food do cats like", "positive": "Cats like eating fish and meat."},
]


@pytest.fixture(scope="module")
def dense_model_st(dense_path):
    return SentenceTransformer(dense_path)


@pytest.fixture(autouse=True)
def local_ray(ray_session):
    """`mine` and `filter` embed through `moe-embed embed`, on the session's local Ray."""


def _scores(model, anchors, docs):
    return model.encode(anchors, normalize_embeddings=True) @ model.encode(docs, normalize_embeddings=True).T


def run_tool(command: str, rows: list[dict], model: str, tmp_path, *options: str) -> list[dict]:
    """`moe-embed mine|filter` on `rows` as a user runs it; the rows it writes."""
    source, out = tmp_path / "pairs.jsonl", tmp_path / f"{command}.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in rows))
    main([command, str(source), "--model", model, "--output", str(out), "--overwrite", *options])
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
@pytest.mark.parametrize("margin", [0.95, 0.8])
def test_mined_negative_is_the_best_candidate_under_the_margin(dense_model_st, dense_path, margin, tmp_path):
    options = ("--margin", str(margin), "--range-max", "10", "--batch-size", "8", "--rows-per-shard", "3")
    triplets = run_tool("mine", PAIRS, dense_path, tmp_path, *options)
    docs = [p["positive"] for p in PAIRS]
    scores = _scores(dense_model_st, [p["anchor"] for p in PAIRS], docs)
    expected = []
    for i, pair in enumerate(PAIRS):  # direct computation: highest-scoring other document below margin x positive
        candidates = sorted((j for j in range(len(docs)) if j != i), key=lambda j: -scores[i, j])
        allowed = [j for j in candidates if scores[i, j] < margin * scores[i, i]]
        if allowed:
            expected.append({"anchor": pair["anchor"], "positive": pair["positive"], "negative": docs[allowed[0]]})
    assert sorted(triplets, key=str) == sorted(expected, key=str)
    assert any(scores[i, j] >= 0.8 * scores[i, i] for i in range(len(docs)) for j in range(len(docs)) if i != j)


def test_consistency_rank_counts_distinct_positives_and_ties_are_not_above():
    """On known vectors: a positive shared by two anchors is one column, and an equal score is not above."""
    vectors = {
        "q1": [1.0, 0.0, 0.0],
        "q3": [0.0, 1.0, 0.0],
        "shared answer": [1.0, 0.0, 0.0],
        "other": [0.6, 0.8, 0.0],
        "far": [0.0, 0.0, 1.0],
    }
    positives = ["shared answer", "far", "other"]
    index = positive_index(iter([np.array([vectors[p] for p in positives], dtype=np.float32)]))
    anchors = ["q1", "q3", "q3", "q1"]
    own = np.array([0, 1, 2, 0])  # q3 -> far: "other" (0.8) is above it, "shared answer" (0.0) ties with it

    def keep(top_k, shards):  # the anchors arrive in shards of any size
        vectors_ = np.array([vectors[a] for a in anchors], dtype=np.float32)
        parts = np.split(vectors_, shards)
        return consistency_keep(iter(parts), index, own, top_k).tolist()

    for shards in ([1], [2, 3], [4]):
        assert keep(1, shards) == [True, False, True, True]
        assert keep(2, shards) == [True, True, True, True]


@pytest.mark.slow
# each top-k with shards of one row and of several: the result does not depend on how the rows are cut
@pytest.mark.parametrize("top_k, rows_per_shard", [(1, "1"), (2, "4"), (3, "1")])
def test_consistency_filter_keeps_pairs_whose_positive_ranks_in_the_top_k(
    dense_model_st, dense_path, top_k, rows_per_shard, tmp_path
):
    noisy = PAIRS + [
        {"anchor": "capital of france", "positive": "Everest is a mountain in Nepal."},
        {"anchor": "what do cats eat", "positive": "Dogs eat meat and kibble."},
    ]
    docs = list(dict.fromkeys(p["positive"] for p in noisy))  # "Dogs eat meat and kibble." appears twice
    scores = _scores(dense_model_st, [p["anchor"] for p in noisy], docs)
    own = np.array([scores[i, docs.index(p["positive"])] for i, p in enumerate(noisy)])
    # No decision of this fixture is knife-edge (float noise from batch composition is ~1e-7), so it cannot flip.
    gaps = [abs(scores[i, j] - own[i]) for i, p in enumerate(noisy) for j, d in enumerate(docs) if d != p["positive"]]
    assert min(gaps) > 1e-4
    expected = [row for i, row in enumerate(noisy) if (scores[i] > own[i]).sum() < top_k]
    options = ("--top-k", str(top_k), "--rows-per-shard", rows_per_shard, "--batch-size", "3")
    assert run_tool("filter", noisy, dense_path, tmp_path, *options) == expected
    assert noisy[-1] not in expected or top_k > 1


@pytest.mark.slow
def test_cli_and_bad_input(dense_path, tmp_path, capsys):
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out, work = tmp_path / "kept.jsonl", tmp_path / "work"
    main(["filter", str(source), "--model", dense_path, "--output", str(out), "--top-k", "2", "--work-dir", str(work)])
    assert 0 < len(out.read_text().splitlines()) <= len(PAIRS)
    assert (work / "anchors" / "part-000000.parquet").is_file()  # the embeddings are kept in a given --work-dir
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"anchor": "a", "answer": "b"}) + "\n")
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"anchor": "a", "positive": " "}) + "\n")
    for args, message in [
        (["mine", str(bad)], "lacks `anchor` or `positive`"),
        (["mine", str(empty)], "has an empty `anchor` or `positive`"),
        (["mine", str(tmp_path / "none.jsonl")], "not found"),
        (["mine", str(source), "--margin", "1.5", "--overwrite"], "--margin must lie in (0, 1]"),
        (["filter", str(source), "--top-k", "0", "--overwrite"], "--top-k must be at least 1"),
        (["filter", str(source)], "already exists; pass --overwrite"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, [*args, "--model", dense_path, "--output", str(out)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_one_prompt_lookup_for_embed_task_mine_and_filter():
    """`prompt_name` (training/embedders.py) answers `embed --task` and the prompts `mine` / `filter` embed with:
    the first name the folder has, each as a prompt name or a MoTE task's name; None where it has none."""
    from moe_embed.training.embedders import prompt_name

    e5 = {"query": "query: ", "passage": "passage: "}  # E5's names: documents are passages
    assert prompt_name(e5, "query") == "query"
    assert prompt_name(e5, "document", "passage") == "passage"
    both = {**e5, "document": "document: "}
    assert prompt_name(both, "document", "passage") == "document"  # the first name wins
    mote = {"query": "search_query: ", "Classification": "classification: "}  # a MoTE folder's mteb names
    assert prompt_name(mote, "classification") == "Classification" == prompt_name(mote, "Classification")
    assert prompt_name(mote, "document", "passage") is None and prompt_name({}, "query") is None
