"""training.data_tools: hard-negative mining with the positive-aware margin, consistency filtering."""

import json

import pytest
from sentence_transformers import SentenceTransformer

from training.data_tools import consistency_filter, main, mine

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
def minilm(dense_path):
    return SentenceTransformer(dense_path)


def _scores(model, anchors, docs):
    return model.encode(anchors, normalize_embeddings=True) @ model.encode(docs, normalize_embeddings=True).T


@pytest.mark.parametrize("margin", [0.95, 0.8])
def test_mined_negative_is_the_best_candidate_under_the_margin(minilm, margin):
    triplets = mine(PAIRS, minilm, margin=margin, num_negatives=1, range_max=10, batch_size=8)
    docs = [p["positive"] for p in PAIRS]
    scores = _scores(minilm, [p["anchor"] for p in PAIRS], docs)
    expected = []
    for i, pair in enumerate(PAIRS):  # direct computation: highest-scoring other document below margin x positive
        candidates = sorted((j for j in range(len(docs)) if j != i), key=lambda j: -scores[i, j])
        allowed = [j for j in candidates if scores[i, j] < margin * scores[i, i]]
        if allowed:
            expected.append({"anchor": pair["anchor"], "positive": pair["positive"], "negative": docs[allowed[0]]})
    assert sorted(triplets, key=str) == sorted(expected, key=str)
    assert any(scores[i, j] >= 0.8 * scores[i, i] for i in range(len(docs)) for j in range(len(docs)) if i != j)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_consistency_filter_keeps_pairs_whose_positive_ranks_in_the_top_k(minilm, top_k):
    noisy = PAIRS + [{"anchor": "capital of france", "positive": "Everest is a mountain in Nepal."},
                     {"anchor": "what do cats eat", "positive": "Dogs eat meat and kibble."}]  # fmt: skip
    docs = [p["positive"] for p in noisy]
    scores = _scores(minilm, [p["anchor"] for p in noisy], docs)
    expected = [row for i, row in enumerate(noisy) if (scores[i] > scores[i, i]).sum() < top_k]
    assert consistency_filter(noisy, minilm, top_k=top_k, batch_size=8) == expected
    assert noisy[-1] not in expected or top_k > 1


def test_cli_and_bad_input(dense_path, tmp_path, capsys):
    source = tmp_path / "pairs.jsonl"
    source.write_text("".join(json.dumps(p) + "\n" for p in PAIRS))
    out = tmp_path / "kept.jsonl"
    main(["filter", str(source), "--model", dense_path, "--output", str(out), "--top-k", "2"])
    assert 0 < len(out.read_text().splitlines()) <= len(PAIRS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"anchor": "a", "answer": "b"}) + "\n")
    for args, message in [
        (["mine", str(bad)], "lacks `anchor` or `positive`"),
        (["mine", str(tmp_path / "none.jsonl")], "not found"),
        (["filter", str(source)], "already exists; pass --overwrite"),
    ]:
        with pytest.raises(SystemExit) as exit_:
            main([*args, "--model", dense_path, "--output", str(out)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
