"""moe_embed.evaluation.intertask: per-text inter-task similarities, the one-sided Welch test, plot and CLI."""

import json

import numpy as np
import pytest
from conftest import save_trained_copy

from moe_embed.convert.instruction_baseline import save_dense_with_prompts
from moe_embed.errors import run_cli
from moe_embed.evaluation.intertask import TASKS, main, pair_similarities, welch_less

TEXTS = [
    "The cat sat on the mat.",
    "Protein folding is driven by hydrophobic interactions.",
    "How do I reset my card PIN?",
    "Stocks fell sharply on Monday.",
    "A man is playing a guitar on stage.",
    "What is the capital of Peru?",
    "Vaccines train the immune system.",
    "The recipe needs two eggs and flour.",
    "I loved this movie so much!",
    "Rain is expected over the weekend.",
    "Who wrote Pride and Prejudice?",
    "The transfer has not arrived yet.",
]


def test_pair_similarities_are_per_text_cosines():
    rng = np.random.default_rng(0)
    raw = {task: rng.normal(size=(5, 8)) for task in TASKS}
    unit = {task: x / np.linalg.norm(x, axis=1, keepdims=True) for task, x in raw.items()}
    sims = pair_similarities(unit)
    assert len(sims) == 6 and ("query", "document") in sims
    for (a, b), values in sims.items():
        expected = [raw[a][i] @ raw[b][i] / np.linalg.norm(raw[a][i]) / np.linalg.norm(raw[b][i]) for i in range(5)]
        np.testing.assert_allclose(values, expected, rtol=1e-12)


def test_welch_less_matches_the_textbook_formula():
    from scipy.stats import t as student_t

    rng = np.random.default_rng(1)
    first, second = rng.normal(0.5, 0.1, 40), rng.normal(0.55, 0.2, 25)
    v1, v2 = first.var(ddof=1) / len(first), second.var(ddof=1) / len(second)
    t = (first.mean() - second.mean()) / np.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1**2 / (len(first) - 1) + v2**2 / (len(second) - 1))
    statistic, p = welch_less(first, second)
    assert statistic == pytest.approx(t) and p == pytest.approx(student_t.cdf(t, df))
    assert welch_less(first - 1, second)[1] < 1e-6 and welch_less(first + 1, second)[1] > 1 - 1e-6


@pytest.fixture(scope="module")
def ic_dir(tmp_path_factory, dense_path, mote_dir):
    """The dense model with MoTE's prompts: instruction conditioning with the same inputs."""
    out = tmp_path_factory.mktemp("ic") / "ic"
    save_dense_with_prompts(mote_dir, out, base=dense_path)
    return str(out)


@pytest.mark.slow
def test_cli_compares_two_models(ic_dir, mote_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS) + "\n")
    trained = tmp_path / "trained"
    save_trained_copy(mote_dir, trained, seed=0)  # experts that differ, as after training

    # the upcycled MoTE computes the dense model's function: identical similarities
    rows = main(
        [
            mote_dir,
            ic_dir,
            "--names",
            "MoTE,IC",
            "--texts",
            str(texts),
            "--output-dir",
            str(tmp_path / "a"),
            "--trust-remote-code",
        ]
    )
    for row in rows:
        assert row["MoTE_mean"] == pytest.approx(row["IC_mean"], abs=1e-5)
    # distinct experts separate the tasks' embeddings: lower similarity, significant for every pair
    rows = main(
        [
            str(trained),
            ic_dir,
            "--names",
            "trained,IC",
            "--texts",
            str(texts),
            "--output-dir",
            str(tmp_path / "b"),
            "--trust-remote-code",
        ]
    )
    assert len(rows) == 6
    for row in rows:
        assert row["trained_mean"] < row["IC_mean"] and row["p"] < 0.01 and row["t"] < 0
        assert 0 < row["IC_sd"] and 0 < row["trained_sd"]
    saved = json.loads((tmp_path / "b" / "intertask.json").read_text())
    assert saved["texts"] == len(TEXTS) and saved["pairs"] == json.loads(json.dumps(rows))
    assert (tmp_path / "b" / "intertask.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| search query vs search document |" in capsys.readouterr().out


def test_cli_refuses_a_model_without_task_prompts(dense_path, ic_dir, tmp_path, capsys):
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(TEXTS))
    with pytest.raises(SystemExit) as exit_:
        run_cli(main, [dense_path, ic_dir, "--texts", str(texts), "--output-dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "defines no prompt for ['classification', 'clustering']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        run_cli(
            main, [ic_dir, ic_dir, "--names", "same,same", "--texts", str(texts), "--output-dir", str(tmp_path / "out")]
        )
    assert "two different comma-separated names" in capsys.readouterr().err
