"""The benchmark scripts run (no timing asserted) and the MoE FLOP bound matches a hand count."""

import re
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, REPO, run_repo_script, tiny_moe_config


def test_flop_bound_for_minilm_shapes():
    sys.path.insert(0, str(REPO))
    from benchmarks.bench_moe import flop_bound_ratio

    config = tiny_moe_config(
        hidden_size=384,
        intermediate_size=1536,
        num_hidden_layers=6,
        num_attention_heads=12,
        num_local_experts=8,
        num_experts_per_tok=2,
    )
    h, i, s = 384, 1536, 16
    dense_layer = 4 * h * h + 2 * s * h + 2 * h * i
    moe_layer = 4 * h * h + 2 * s * h + 2 * 2 * h * i + 8 * h
    expected = 6 * dense_layer / (3 * dense_layer + 3 * moe_layer)
    assert abs(flop_bound_ratio(config, s) - expected) < 1e-12
    assert 0.74 < expected < 0.76  # "about 0.75x the dense throughput" for top-2 in half the layers


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="bench_memory reads peak memory from /proc/self/status")
def test_benchmark_scripts_run(dense_path, mote_dir, moe_dir, capsys):
    quick = ["--batch-sizes", "2", "--seq-lens", "16", "--repeats", "1", "--min-time", "0.01", "--base", dense_path]
    mote = run_repo_script("benchmarks/bench_mote.py", *quick, "--model", mote_dir, capsys=capsys)
    assert mote.strip().splitlines()[-1].startswith("| 2 | 16 |")
    moe = run_repo_script("benchmarks/bench_moe.py", *quick, "--model", moe_dir, capsys=capsys)
    row = moe.strip().splitlines()[-1]
    assert row.startswith("| 2 | 16 |") and row.count("|") == 9
    aea = run_repo_script("benchmarks/bench_aea.py", *quick, "--calibration-texts", "4", capsys=capsys)
    name = f"| MoE {Path(dense_path).name} |"
    rows = [line for line in aea.splitlines() if line.startswith(name) or line.startswith("| OLMoE")]
    assert len(rows) == 4 and rows[0].startswith(f"{name} 2 | 16 |") and "calibration" in rows[1]
    assert all(row.count("|") == 8 for row in rows)  # the expert-rows column too


def test_batch_of_mixes_every_task_or_takes_the_given(mote_model):
    from benchmarks.common import batch_of
    from moe_embed.modeling.task_router import TaskRouter

    config = mote_model.config
    mixed = TaskRouter(config).match(batch_of(mote_model, 8, 16)["input_ids"])[0]
    assert mixed.tolist() == [row % config.num_tasks for row in range(8)]  # routed by the prefixes written
    query = TaskRouter(config).match(batch_of(mote_model, 8, 16, ["query"])["input_ids"])[0]
    assert query.tolist() == [config.tasks.index("query")] * 8


@pytest.mark.slow
def test_serving_benchmark_runs(dense_path, capsys):
    quick = ["--batch-sizes", "2", "--seq-lens", "16", "--repeats", "1", "--min-time", "0.01", "--base", dense_path]
    fresh = ["--fresh-rounds", "1", "--fresh-batch-sizes", "2"]
    args = [*quick, *fresh, "--families", "dense,mote,mote-one-task", "--accuracy", "--data-dir", str(FIXTURE_DATA)]
    out = run_repo_script("benchmarks/bench_serving.py", *args, capsys=capsys)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| dense") or line.startswith("| mote")]
    # timing, the dense reference timed in the MoTE families' rounds, each int8 graph alone in a new process, then
    # accuracy (the routed folder scored once)
    one = "| mote-one-task"
    families = ["| dense", "| mote", one]
    assert [row[0] for row in rows] == [*families, "| mote", one, *families, "| dense", "| mote"]
    timing, reference, accuracy = rows[:2], rows[3], rows[8:]
    # rate, of dense, fastest call's rate, of dense
    table = out[out.index("fastest call (seq/s)") :].splitlines()
    alone = [[cell.strip() for cell in line.split("|")[1:-1]] for line in table if line.startswith("| ")][:3]
    assert [row[0] for row in alone] == ["dense", "mote", "mote-one-task"]
    assert all(len(row) == 7 and row[1:3] == ["2", "16"] for row in alone)
    for rate, of_dense in ((3, 4), (5, 6)):
        rates = [float(row[rate]) for row in alone]
        assert min(rates) > 0 and alone[0][of_dense] == ""
        for row, value in zip(alone[1:], rates[1:], strict=True):
            assert abs(float(row[of_dense]) - value / rates[0]) < 0.006
    assert all(len(row) == 10 and float(row[-1].rstrip(" |")) > 0 for row in rows[:3])
    assert "of dense" in timing[1][4] and "of dense" not in timing[0][4]
    # onnxruntime int8's "of dense" is to the dense session of the same rounds (the reference row), not dense's row
    cell = r"([\d.]+) \([\d.]+x, ([\d.]+)x fp32 graph, ([\d.]+) of dense\)"
    mote_int8, of_fp32, of_dense = (float(v) for v in re.fullmatch(cell, timing[1][5]).groups())
    assert abs(mote_int8 / float(reference[3].rstrip(" |")) - of_dense) < 0.006
    # and against onnxruntime's fp32 graph of the same family, same rounds
    assert abs(mote_int8 / float(timing[1][4].split()[0]) - of_fp32) < 0.006
    for row in accuracy:  # fp32, onnxruntime int8, its difference, OpenVINO int8, its difference; STS-B, SciFact
        values = [float(v.rstrip(" |")) for v in row[1:]]
        for fp32, int8, delta, ov, ov_delta in (values[:5], values[5:10]):
            assert abs(int8 - fp32 - delta) < 0.011 and abs(ov - fp32 - ov_delta) < 0.011
            assert 0 < fp32 <= 100 and 0 < int8 <= 100 and 0 < ov <= 100


@pytest.mark.slow
def test_int8_accuracy_script_runs(trained_mote, capsys):
    out = run_repo_script(
        "benchmarks/int8_accuracy.py", str(trained_mote), "--data-dir", str(FIXTURE_DATA), capsys=capsys
    )
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith(f"| {trained_mote.name} ")]
    assert len(rows) == 1
    values = [float(v.rstrip(" |")) for v in rows[0][1:]]
    # the exporter's agreement (onnxruntime min and mean, OpenVINO min), then per task fp32, int8, delta, OpenVINO
    # int8, delta, for STS-B and SciFact
    low, mean, ov_low = values[:3]
    assert 0.5 < low <= mean <= 1.0 + 1e-6 and 0.5 < ov_low <= 1.0 + 1e-6
    for fp32, int8, delta, ov, ov_delta in (values[3:8], values[8:13]):
        assert 0 < fp32 <= 100 and 0 < int8 <= 100 and abs(int8 - fp32 - delta) < 0.011
        assert 0 < ov <= 100 and abs(ov - fp32 - ov_delta) < 0.011


def test_int8_accuracy_script_refuses_bad_input(tmp_path, capsys):
    for args in ([str(tmp_path)], ["--tasks", "NoSuchTask"]):
        with pytest.raises(SystemExit) as exit_info:
            run_repo_script("benchmarks/int8_accuracy.py", *args, capsys=capsys)
        assert exit_info.value.code == 2
    errors = capsys.readouterr().err
    assert "no config.json" in errors and "expected suite tasks" in errors


def test_serving_refuses_a_dense_reference_outside_its_backends(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_repo_script(
            "benchmarks/bench_serving.py", "--backends", "torch,ort", "--dense-reference", "ov", capsys=capsys
        )
    assert exit_info.value.code == 2 and "unknown --dense-reference ['ov']" in capsys.readouterr().err


def test_serving_accuracy_refuses_unknown_tasks_and_missing_data_before_exporting(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for tasks, expected in (("NoSuchTask", "unknown tasks ['NoSuchTask']"), ("SICK-R", "mteb/sickr-sts")):
        with pytest.raises(SystemExit) as exit_info:  # the fixtures hold no copy of SICK-R's dataset
            args = ["--accuracy", "--accuracy-tasks", tasks, "--data-dir", str(FIXTURE_DATA)]
            run_repo_script("benchmarks/bench_serving.py", *args, capsys=capsys)
        error = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and expected in error and "\n" not in error


@pytest.mark.slow
def test_onnx_encoder_is_scored_by_mteb_as_its_sentence_transformer(trained_mote, mote_onnx):
    """The fp32 graph, fed as a client feeds it, gets the prompts mteb gives the model (its experts differ, so a
    wrong prompt would change the scores)."""
    from mteb.types import PromptType
    from sentence_transformers import SentenceTransformer

    from benchmarks.onnx_encoder import OnnxEncoder
    from moe_embed.convert.cpu_graph import GRAPH_FILE
    from moe_embed.evaluation.run import load_tasks
    from moe_embed.evaluation.tasks import score

    encoder = OnnxEncoder(mote_onnx, GRAPH_FILE)
    tasks = load_tasks(["STSBenchmark", "SciFact", "Banking77Clustering"], str(FIXTURE_DATA))
    prompts = [
        encoder.prompt(tasks[name].metadata, kind)
        for name, kind in [
            ("STSBenchmark", None),
            ("SciFact", PromptType.query),
            ("SciFact", PromptType.document),
            ("Banking77Clustering", None),
        ]
    ]
    assert prompts == ["classification: ", "search_query: ", "search_document: ", "clustering: "]
    model = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    for task in tasks.values():
        assert score(encoder, task) == pytest.approx(score(model, task), abs=1e-3)


@pytest.mark.slow
def test_int8_graphs_benchmark_runs(dense_path, capsys):
    quick = ["--batch-sizes", "2", "--seq-lens", "8", "--repeats", "1", "--min-time", "0.01", "--base", dense_path]
    out = run_repo_script("benchmarks/int8_graphs.py", *quick, capsys=capsys)
    header = next(line for line in out.splitlines() if line.startswith("| batch"))
    assert "| package int8 |" in header and "| dynamo int8 |" in header and "| package, keys copied int8 |" in header
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 2 | 8 |")]
    assert len(rows) == 1
    for cell in rows[0][3:]:  # every graph shape embeds as PyTorch does, up to int8's rounding
        assert float(cell.split("cos ")[1].rstrip(") |")) > 0.9, cell


def test_ort_kernels_benchmark_runs(capsys):
    out = run_repo_script(
        "benchmarks/ort_kernels.py", "--shapes", "2x4", "--repeats", "1", "--min-time", "0.01", capsys=capsys
    )
    assert "CPU (flags:" in out
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| 2 | 4 |")]
    assert len(rows) == 1 and all(float(v.rstrip(" |")) > 0 for v in rows[0][2:])


@pytest.mark.slow
def test_int8_settings_script_runs(dense_path, capsys):
    args = ["--data-dir", str(FIXTURE_DATA), "--texts", "4", "--base", dense_path]
    out = run_repo_script("benchmarks/int8_settings.py", *args, capsys=capsys)
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| QInt8") or line.startswith("| QUInt8")]
    assert len(rows) == 6
    for row in rows:  # min and mean cosine of int8 to fp32 embeddings
        low, mean = float(row[-2]), float(row[-1].rstrip(" |"))
        assert 0.5 < low <= mean <= 1.0 + 1e-6


@pytest.mark.slow
def test_compile_benchmark_runs(mote_dir, capsys):
    quick = ["--batch-sizes", "2", "--seq-lens", "16", "--repeats", "1", "--min-time", "0.01"]
    out = run_repo_script(
        "benchmarks/bench_compile.py", *quick, "--backend", "aot_eager", "--model", mote_dir, capsys=capsys
    )
    rows = [line.split(" | ") for line in out.splitlines() if line.startswith("| task=") or line.startswith("| mixed")]
    assert len(rows) == 3 and all(len(row) == 8 for row in rows)
    assert [row[6] for row in rows[:2]] == ["1", "1"]  # one graph for a named task and for dynamic output shapes


@pytest.mark.slow
def test_training_benchmark_runs(dense_path, tmp_path, capsys):
    import json

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(
        "".join(
            json.dumps({"anchor": f"question {i}", "positive": f"answer {i}", "negative": f"other {i}"}) + "\n"
            for i in range(6)
        )
    )
    out = run_repo_script(
        "benchmarks/bench_train.py",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--steps",
        "1",
        "--repeats",
        "1",
        "--pairs",
        str(pairs),
        "--base",
        dense_path,
        capsys=capsys,
    )
    rows = out.strip().splitlines()[-2:]
    assert rows[0].startswith("| dense + prompts |") and rows[1].startswith("| MoTE |")
    assert all(row.count("|") == 6 for row in rows)


def test_training_benchmark_without_pairs_or_shared_data_stops_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MOE_EMBED_SHARED", str(tmp_path / "missing"))
    with pytest.raises(SystemExit) as exit_info:
        run_repo_script("benchmarks/bench_train.py", capsys=capsys)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert exit_info.value.code == 2 and str(tmp_path / "missing") in error and "--pairs" in error


def test_comoe_flop_bound_for_minilm_shapes():
    sys.path.insert(0, str(REPO))
    from conftest import tiny_comoe_config

    from benchmarks.bench_comoe import flop_bound_ratio

    config = tiny_comoe_config(
        hidden_size=384, intermediate_size=1536, num_hidden_layers=6, num_attention_heads=12, lora_rank=16
    )
    h, i, s = 384, 1536, 16
    dense = 6 * (4 * h * h + 2 * s * h + 2 * h * i)
    per_linear = 4 * h + 2 * 16 * (h + h)  # router + the two top-2 LoRA products
    assert abs(flop_bound_ratio(config, s, 2) - dense / (dense + 24 * per_linear)) < 1e-12
    assert 0.93 < flop_bound_ratio(config, s, 2) < 0.95  # the "about 0.94"
    assert flop_bound_ratio(config, s, 4) < flop_bound_ratio(config, s, 2)


@pytest.mark.slow
def test_comoe_benchmark_runs(dense_path, comoe_dir, capsys):
    quick = ["--batch-sizes", "2", "--seq-lens", "16", "--repeats", "1", "--min-time", "0.01", "--base", dense_path]
    train = ["--train-steps", "1", "--train-batch", "2", "--train-tokens", "8"]
    out = run_repo_script("benchmarks/bench_comoe.py", *quick, *train, "--model", comoe_dir, capsys=capsys)
    lines = out.strip().splitlines()
    assert any(line.startswith("| 2 | 16 |") and line.count("|") == 8 for line in lines)
    assert sum(line.startswith(("| CoMoE", "| MoE-LoRA", "| LoRA", "| full")) for line in lines) == 4


def table_rows(lines, header, count):
    """The `count` data rows under a markdown table's `header` line, as lists of cells (found by the header, not
    by a first cell: a rate printed in another table can read as a row count)."""
    start = lines.index(header) + 2  # past the header and its |---:| line
    return [line.strip("| ").split(" | ") for line in lines[start : start + count]]


@pytest.mark.slow
def test_embed_benchmark_runs(dense_path, capsys):
    args = [
        "--sizes",
        "40",
        "--methods",
        "encode,ray,cli",
        "--rounds",
        "1",
        "--memory-sizes",
        "20,200",
        "--base",
        dense_path,
    ]
    args += ["--id-check-sizes", "1000,30000"]
    lines = run_repo_script("benchmarks/bench_embed.py", *args, capsys=capsys).splitlines()
    header = "| rows | encode (rows/s) | ray (rows/s) | ray / best ST | ray-int8 / ray-running |"
    [timed] = table_rows(lines, header, 1)
    assert timed[0] == "40" and all(float(cell) > 0 for cell in timed[1:4])
    [shell] = table_rows(lines, "| rows | encode (rows/s) | cli (rows/s) | cli / best ST |", 1)
    encode, cli, ratio = (float(cell) for cell in shell[1:])  # from a shell: encode, the command
    # the rates are printed rounded (whole rows/s, two significant digits below 10), the ratio from the unrounded
    e, c = (0.5 if rate >= 10 else 0.05 if rate >= 1 else 0.005 for rate in (encode, cli))
    assert shell[0] == "40" and encode > 0 and cli > 0
    assert (cli - c) / (encode + e) - 0.006 <= ratio <= (cli + c) / (encode - e) + 0.006
    calls = next(i for i, line in enumerate(lines) if line.startswith("The model's calls alone at 40 rows"))
    [called] = table_rows(lines[calls:], "| encode (rows/s) | ray (rows/s) | cli (rows/s) |", 1)
    assert all(float(cell) > 0 for cell in called)  # every method's calls timed
    memory = table_rows(lines, "| rows | ray-running (rows/s) | driver peak (MiB) | worker peak (MiB) |", 2)
    assert [row[0] for row in memory] == ["20", "200"]
    assert all(float(cell) > 0 for row in memory for cell in row[1:])  # rate, driver, worker at both sizes
    checks = table_rows(lines, "| ids | seconds | process peak (MiB) | at its start (MiB) |", 2)
    assert [row[0] for row in checks] == ["1000", "30000"]
    assert all(float(peak) >= float(start) > 0 for _, _, peak, start in checks)


def test_actor_benchmark_runs(dense_path, capsys):
    args = ["--base", dense_path, "--families", "dense,mote", "--batch-sizes", "4,16", "--rows", "24"]
    lines = run_repo_script("benchmarks/bench_actor.py", *args, "--rows-per-shard", "10", capsys=capsys).splitlines()
    rows = table_rows(lines, "| family | batch | encode (rows/s) | actor (rows/s) | actor / encode |", 4)
    assert [row[:2] for row in rows] == [["dense", "4"], ["dense", "16"], ["mote", "4"], ["mote", "16"]]
    for _, _, encode, actor, ratio in rows:
        encode, actor, ratio = float(encode), float(actor), float(ratio)
        assert encode > 0 and actor > 0  # the ratio of the unrounded rates, within the printed rounding
        assert (actor - 0.5) / (encode + 0.5) - 0.006 <= ratio <= (actor + 0.5) / (encode - 0.5) + 0.006


@pytest.mark.parametrize("words", ["ten", "5-2", "0"])
def test_actor_benchmark_refuses_bad_word_ranges(words, capsys):
    with pytest.raises(SystemExit) as stopped:
        run_repo_script("benchmarks/bench_actor.py", "--words", words, capsys=capsys)
    assert stopped.value.code == 2 and "--words" in capsys.readouterr().err


def test_expert_split_variants_compute_what_they_stand_for():
    import numpy as np
    import onnxruntime

    from benchmarks.expert_split import HIDDEN, build

    feed = {"x": np.random.default_rng(1).normal(size=(12, HIDDEN)).astype(np.float32), "counts": np.full(4, 3)}
    out = {}
    for variant in ("one FFN", "4 experts", "4 x shared weights", "stacked", "QMoE"):
        model = build(variant, layers=2).SerializeToString()
        out[variant] = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    # the same weights in a routed layout compute the same function; each expert's own weights another one
    np.testing.assert_allclose(out["4 x shared weights"], out["one FFN"], atol=1e-4)
    np.testing.assert_allclose(out["stacked"], out["4 experts"], atol=1e-4)
    np.testing.assert_allclose(out["4 experts"][:3], out["one FFN"][:3], atol=1e-4)  # expert 0 is the FFN's
    assert np.abs(out["4 experts"][3:] - out["one FFN"][3:]).max() > 0.1
    # onnxruntime's fused operator on the unsorted tokens, its weights in 8 bits: each token's own expert
    assert np.abs(out["QMoE"] - out["4 experts"]).max() < 0.1 < np.abs(out["QMoE"] - out["one FFN"]).max()


def test_expert_split_benchmark_runs(capsys):
    out = run_repo_script(
        "benchmarks/expert_split.py",
        "--tokens",
        "8",
        "--layers",
        "1",
        "--repeats",
        "1",
        "--min-time",
        "0.01",
        capsys=capsys,
    )
    [row] = table_rows(out.splitlines(), next(line for line in out.splitlines() if line.startswith("| tokens")), 1)
    assert row[0] == "8" and len(row) == 10
    for cell in row[1:6]:  # median (fastest-slowest round)
        median, low, high = (float(v) for v in re.fullmatch(r"([\d.]+) \(([\d.]+)-([\d.]+)\)", cell).groups())
        assert 0 < low <= median <= high
    assert all(float(cell) > 0 for cell in row[6:])
    with pytest.raises(SystemExit) as error:
        run_repo_script("benchmarks/expert_split.py", "--tokens", "6", capsys=capsys)
    assert error.value.code == 2


def test_session_rate_times_a_graph_and_refuses_a_missing_one(tmp_path, capsys):
    import numpy as np

    from benchmarks.expert_split import HIDDEN, build

    model, feed = tmp_path / "block.onnx", tmp_path / "feed.npz"
    model.write_bytes(build("one FFN", layers=1).SerializeToString())
    np.savez(feed, x=np.ones((8, HIDDEN), np.float32), counts=np.full(4, 2), unused=np.zeros(3))
    out = run_repo_script("benchmarks/session_rate.py", str(model), str(feed), "--min-time", "0.01", capsys=capsys)
    rate, fastest = (float(value) for value in out.split()[-2:])
    assert 0 < rate <= fastest * (1 + 1e-9)  # over every call, and in the fastest one (equal if all calls tie)
    with pytest.raises(SystemExit) as error:
        run_repo_script("benchmarks/session_rate.py", str(tmp_path / "missing.onnx"), str(feed), capsys=capsys)
    assert error.value.code == 2
