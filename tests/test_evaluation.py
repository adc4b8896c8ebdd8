"""The local evaluation suite: each task type's score against an independent computation on tiny
fixtures in the layout of ../shared/data, and the CLI's errors; one check reads the real data
(skipped where it is absent)."""

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import requires_shared_data
from scipy.stats import spearmanr
from sentence_transformers import SentenceTransformer
from sklearn.metrics import average_precision_score

from evaluation.metrics import (
    classification_accuracy,
    classification_experiment_accuracies,
    clustering_v_measure,
    ndcg_at_k,
    undersample,
    undersample_draws,
)
from evaluation.run import TASKS, evaluate
from evaluation.run import main as run_main
from moe_embed import data as D
from moe_embed.usage import run_cli

SENTENCES = [
    ("A man is playing a guitar.", "A person plays an instrument.", 4.2),
    ("A dog runs in the park.", "A cat sleeps on the sofa.", 0.8),
    ("The stock market fell today.", "Shares dropped sharply.", 4.5),
    ("She is cooking pasta.", "A woman prepares food.", 3.9),
    ("The sky is blue.", "Quantum computers use qubits.", 0.1),
    ("Children play football.", "Kids are playing soccer.", 4.8),
]


def _write_tsv(path: Path, header: list[str], rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    _write_tsv(root / "sts/stsb/test.tsv", ["score", "sentence1", "sentence2"], [[s, a, b] for a, b, s in SENTENCES])
    _write_tsv(
        root / "pair_classification/twitter_url_corpus/test.tsv",
        ["sentence1", "sentence2", "label"],
        [[a, b, int(s > 2.5)] for a, b, s in SENTENCES] + [["x", "y", ""]],
    )
    docs = {
        "d1": ("Guitars", "A guitar is a string instrument."),
        "d2": ("Dogs", "Dogs are loyal pets."),
        "d3": ("Markets", "Stock markets trade shares."),
        "d4": ("Pasta", "Pasta is an Italian food."),
    }
    (root / "retrieval/scifact/qrels").mkdir(parents=True)
    (root / "retrieval/scifact/corpus.jsonl").write_text(
        "".join(json.dumps({"_id": k, "title": t, "text": x}) + "\n" for k, (t, x) in docs.items())
    )
    (root / "retrieval/scifact/queries.jsonl").write_text(
        "".join(
            json.dumps({"_id": q, "text": t}) + "\n"
            for q, t in [("q1", "string instruments"), ("q2", "italian cooking"), ("q3", "unjudged")]
        )
    )
    _write_tsv(
        root / "retrieval/scifact/qrels/test.tsv",
        ["query-id", "corpus-id", "score"],
        [["q1", "d1", 1], ["q2", "d4", 1], ["q2", "d2", 1]],
    )
    texts = [
        ("I lost my card", "card"),
        ("my card was stolen", "card"),
        ("card missing", "card"),
        ("where is my card", "card"),
        ("transfer money abroad", "transfer"),
        ("send money to a friend", "transfer"),
        ("wire funds", "transfer"),
        ("move money", "transfer"),
    ]
    _write_tsv(root / "classification/banking77/train.tsv", ["text", "label"], [list(t) for t in texts])
    _write_tsv(root / "classification/banking77/test.tsv", ["text", "label"], [list(t) for t in texts[::2]])
    return root


@pytest.fixture(scope="module")
def minilm(dense_path):
    return SentenceTransformer(dense_path)


def test_sts_and_pair_classification_match_direct_computation(minilm, data_root):
    a = minilm.encode([s[0] for s in SENTENCES], convert_to_tensor=True)
    b = minilm.encode([s[1] for s in SENTENCES], convert_to_tensor=True)
    cosine = (a * b).sum(-1).numpy() / (np.linalg.norm(a.numpy(), axis=1) * np.linalg.norm(b.numpy(), axis=1))
    expected_sts = 100 * spearmanr([s[2] for s in SENTENCES], cosine).statistic
    assert evaluate(minilm, TASKS["STSBenchmark"], TASKS["STSBenchmark"].load(data_root)) == pytest.approx(
        expected_sts, abs=1e-6
    )
    labels = [int(s[2] > 2.5) for s in SENTENCES]
    # all-MiniLM-L6-v2 normalises, so cosine and dot give the same AP; max over functions >= cosine AP
    pair = evaluate(minilm, TASKS["TwitterURLCorpus"], TASKS["TwitterURLCorpus"].load(data_root))
    assert pair >= 100 * average_precision_score(labels, cosine) - 1e-6


def test_retrieval_matches_hand_ndcg(minilm, data_root):
    data = D.beir(data_root / "retrieval/scifact")
    assert set(data.queries) == {"q1", "q2"}  # queries without judgements are dropped, as in BEIR
    ids = list(data.corpus)
    docs = minilm.encode([data.corpus[i] for i in ids])
    scores = []
    for qid, text in data.queries.items():
        sims = docs @ minilm.encode(text)
        ranked = [ids[i] for i in np.argsort(-sims)]
        scores.append(ndcg_at_k(ranked, data.relevant[qid], 10))
    assert evaluate(minilm, TASKS["SciFact"], TASKS["SciFact"].load(data_root)) == pytest.approx(
        100 * np.mean(scores), abs=1e-4
    )


def test_ndcg_hand_example():
    # relevant at ranks 1 and 3 of 2 relevant: (1 + 1/log2(4)) / (1 + 1/log2(3))
    assert ndcg_at_k(["a", "x", "b"], {"a", "b"}, 10) == pytest.approx((1 + 0.5) / (1 + 1 / np.log2(3)))
    assert ndcg_at_k(["x", "y"], {"a"}, 10) == 0.0


def test_classification_and_clustering_protocols():
    rng = np.random.default_rng(0)
    labels = ["a"] * 30 + ["b"] * 30 + ["c"] * 30
    centres = {"a": [5, 0], "b": [0, 5], "c": [-5, -5]}
    points = np.array([centres[label] for label in labels]) + rng.normal(0, 0.3, (90, 2))
    index = undersample(labels, 4, np.random.default_rng(1).permutation(len(labels)))
    assert sorted(np.array(labels)[index].tolist()) == ["a"] * 4 + ["b"] * 4 + ["c"] * 4
    assert classification_accuracy(points, labels, points, labels, samples_per_label=4) == 1.0
    shuffled = list(rng.permutation(labels))
    assert classification_accuracy(points, shuffled, points, labels, samples_per_label=8) < 0.7
    assert clustering_v_measure(points, labels) == pytest.approx(1.0)
    # the protocol reads only the drawn rows: blanking the others (as evaluation.run does) changes nothing
    noisy = points + rng.normal(0, 3.0, points.shape)
    used = np.unique(np.concatenate(undersample_draws(labels, 4)))
    assert 0 < len(used) < 90
    blanked = np.zeros_like(noisy)
    blanked[used] = noisy[used]
    assert classification_accuracy(blanked, labels, noisy, labels, samples_per_label=4) == classification_accuracy(
        noisy, labels, noisy, labels, samples_per_label=4
    )
    assert clustering_v_measure(rng.normal(size=(90, 2)), labels) < 0.2


def _mteb_style_draws(
    labels: list, samples_per_label: int, n_experiments: int, seed: int, reseed: bool = True
) -> list[list[int]]:
    """mteb 1.12's draws, written out with NumPy's global generator as mteb uses it: the task's constructor
    seeds it, each experiment shuffles the one index array in place and keeps the first rows of every
    label, and the experiment's evaluator reseeds it (`reseed=False` leaves that out)."""
    saved = np.random.get_state()
    try:
        np.random.seed(seed)
        positions = np.arange(len(labels))
        draws = []
        for _ in range(n_experiments):
            np.random.shuffle(positions)
            taken: dict = {}
            draw = []
            for i in positions:
                if taken.get(labels[i], 0) < samples_per_label:
                    taken[labels[i]] = taken.get(labels[i], 0) + 1
                    draw.append(int(i))
            draws.append(draw)
            if reseed:
                np.random.seed(seed)
        return draws
    finally:
        np.random.set_state(saved)


@pytest.mark.parametrize("seed", [42, 7])
def test_undersample_draws_reproduce_mteb_global_rng_procedure(seed):
    rng = np.random.default_rng(3)
    names = ["sadness", "joy", "love", "anger", "fear", "surprise"]
    labels = list(rng.choice(names, size=500, p=[0.3, 0.3, 0.15, 0.15, 0.07, 0.03]))
    labels[:5] = ["rare"] * 5  # fewer rows than samples_per_label: all of them, every time
    expected = _mteb_style_draws(labels, 16, 10, seed)
    before = np.random.get_state()[1].copy()
    draws = undersample_draws(labels, 16, n_experiments=10, seed=seed)
    assert np.array_equal(np.random.get_state()[1], before)  # NumPy's global generator is left alone
    assert [d.tolist() for d in draws] == expected
    assert len({tuple(d) for d in expected}) == 10  # the experiments do differ
    # the draws pin mteb's reseeding: one generator seeded once gives other draws from the second experiment on
    seeded_once = _mteb_style_draws(labels, 16, 10, seed, reseed=False)
    assert seeded_once[0] == expected[0] and seeded_once[1:] != expected[1:]


def test_classification_from_drawn_rows_equals_all_rows():
    rng = np.random.default_rng(5)
    labels = [str(i % 4) for i in range(400)]
    centres = rng.normal(0, 1.0, (4, 8))
    points = centres[[int(label) for label in labels]] + rng.normal(0, 1.5, (400, 8))  # overlapping classes
    test_labels = [str(i % 4) for i in range(120)]
    test_points = centres[[int(label) for label in test_labels]] + rng.normal(0, 1.5, (120, 8))
    draws = undersample_draws(labels, 8, n_experiments=4)
    used = np.unique(np.concatenate(draws))
    assert 0 < len(used) < len(labels)
    blanked = np.full_like(points, np.nan)  # rows no experiment draws: any read of them would show
    blanked[used] = points[used]
    full = classification_experiment_accuracies(
        points, labels, test_points, test_labels, n_experiments=4, samples_per_label=8
    )
    partial = classification_experiment_accuracies(blanked, labels, test_points, test_labels, draws=draws)
    assert partial == full
    assert len(set(full)) > 1 and 0.3 < min(full) and max(full) < 1.0  # a non-trivial problem
    assert classification_accuracy(blanked, labels, test_points, test_labels, draws=draws) == pytest.approx(
        np.mean(full), abs=1e-12
    )


def test_cli_writes_results_and_refuses_bad_input(dense_path, data_root, tmp_path, capsys):
    out = tmp_path / "results.json"
    run_main(
        [
            dense_path,
            "--tasks",
            "STSBenchmark,Banking77Classification",
            "--data-dir",
            str(data_root),
            "--output",
            str(out),
        ]
    )
    results = json.loads(out.read_text())
    assert set(results) == {"STSBenchmark", "Banking77Classification"}
    assert (
        results["STSBenchmark"]["metric"] == "cosine_spearman"
        and 0 <= results["Banking77Classification"]["main_score"] <= 100
    )
    assert "| STSBenchmark | sts | cosine_spearman |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        run_cli(run_main, [dense_path, "--tasks", "STSBenchmark,NoSuchTask", "--data-dir", str(data_root)])
    assert exit_.value.code == 2 and "unknown tasks ['NoSuchTask']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run_cli(run_main, [dense_path, "--tasks", "SICK-R", "--data-dir", str(data_root)])
    assert exit_.value.code == 2 and "missing data file" in capsys.readouterr().err


def test_prompts_follow_the_task_type(mote_dir):
    from evaluation.run import prompt_for

    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    assert prompt_for(model, "retrieval", "query") == "search_query: "
    assert prompt_for(model, "retrieval", "document") == "search_document: "
    assert prompt_for(model, "sts") == "classification: " and prompt_for(model, "clustering") == "clustering: "


@requires_shared_data
def test_sst2_task_reads_the_sentence_test_split_and_phrase_train_split():
    data = TASKS["SST2Classification (local)"].load(D.data_dir(None))  # the shared data itself
    assert len(data.test_texts) == 1821 and len(data.train_texts) == 67349  # the data README's counts
    assert set(data.test_labels) == set(data.train_labels) == {"0", "1"}
    assert TASKS["SST2Classification (local)"].type == "classification"
