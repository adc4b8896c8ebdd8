"""training.data_tools: hard-negative mining with the positive-aware margin, consistency filtering."""

import json

import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer

from moe_embed.usage import run_cli
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


@pytest.mark.slow
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


class BatchNoiseEmbeddings:
    """A stand-in model with known embeddings plus a small error that depends on the batch a text is
    encoded in, as padding and BLAS give real models: the same text in two batches gets two
    slightly different vectors (an extra coordinate of 1e-3 x the batch's character count)."""

    prompts: dict = {}

    def __init__(self, vectors: dict[str, list[float]]):
        self.vectors = vectors

    def encode(self, texts, batch_size, **kwargs):
        rows = []
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            error = 1e-3 * len("".join(batch))
            rows += [[*self.vectors[t], error] for t in batch]
        return torch.nn.functional.normalize(torch.tensor(rows), dim=-1)


def test_consistency_filter_rank_counts_distinct_positives_and_ties_are_not_above():
    model = BatchNoiseEmbeddings(
        {
            "q1": [1.0, 0.0, 0.0],
            "q2": [1.0, 0.0, 0.0],
            "q3": [0.0, 1.0, 0.0],
            "shared answer": [1.0, 0.0, 0.0],
            "other": [0.6, 0.8, 0.0],
            "far": [0.0, 0.0, 1.0],
        }
    )
    rows = [
        {"anchor": "q1", "positive": "shared answer"},  # q1 and q2 share a positive: a tie, not a rank above
        {"anchor": "q3", "positive": "far"},  # "other" (0.8) is above; "shared answer" (0.0) ties with "far" (0.0)
        {"anchor": "q3", "positive": "other"},  # q3's best positive
        {"anchor": "q2", "positive": "shared answer"},  # in another batch than row 0's copy of the same text
    ]
    assert consistency_filter(rows, model, top_k=1, batch_size=2) == [rows[0], rows[2], rows[3]]
    assert consistency_filter(rows, model, top_k=2, batch_size=2) == rows
    # A duplicated row counts once: rank is over distinct texts, so duplicating "other" changes nothing.
    assert consistency_filter(rows + [rows[2]], model, top_k=1, batch_size=3) == [rows[0], rows[2], rows[3], rows[2]]


@pytest.mark.slow
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_consistency_filter_keeps_pairs_whose_positive_ranks_in_the_top_k(minilm, top_k):
    noisy = PAIRS + [
        {"anchor": "capital of france", "positive": "Everest is a mountain in Nepal."},
        {"anchor": "what do cats eat", "positive": "Dogs eat meat and kibble."},
    ]
    docs = list(dict.fromkeys(p["positive"] for p in noisy))  # "Dogs eat meat and kibble." appears twice
    scores = _scores(minilm, [p["anchor"] for p in noisy], docs)
    own = np.array([scores[i, docs.index(p["positive"])] for i, p in enumerate(noisy)])
    # No decision of this fixture is knife-edge, so float noise from batch composition cannot flip it.
    gaps = [abs(scores[i, j] - own[i]) for i, p in enumerate(noisy) for j, d in enumerate(docs) if d != p["positive"]]
    assert min(gaps) > 1e-3
    expected = [row for i, row in enumerate(noisy) if (scores[i] > own[i]).sum() < top_k]
    for batch_size in (1, 8):
        assert consistency_filter(noisy, minilm, top_k=top_k, batch_size=batch_size) == expected
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
            run_cli(main, [*args, "--model", dense_path, "--output", str(out)])
        assert exit_.value.code == 2 and message in capsys.readouterr().err
