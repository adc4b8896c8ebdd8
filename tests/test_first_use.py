"""What a new user met on a fresh clone, one test each: inputs checked before the long steps, results kept as
they come, quiet commands, and errors about what is actually wrong. (The adapter folder's base and the one-task
export's prompts are tested beside their converters: test_bad_input.py, test_merge_experts.py.)"""

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, REPO, run_main

from moe_embed.evaluation.run import main as evaluate_main
from moe_embed.training.train import main as train_main


def test_training_takes_data_dir_and_reads_every_dataset_before_upcycling(tmp_path, monkeypatch, capsys):
    """The recipe reads the data folder; `--data-dir` names one, and a missing file is the first thing said,
    before minutes of upcycling and loading."""
    import moe_embed.convert.upcycle

    def upcycle(*args, **kwargs):
        raise AssertionError("upcycled before every dataset was read")

    monkeypatch.setattr(moe_embed.convert.upcycle, "upcycle", upcycle)
    recipe = REPO / "examples" / "train_mote.yaml"
    code, err = run_main(train_main, "--config", str(recipe), "--data-dir", str(FIXTURE_DATA), capsys=capsys)
    assert code == 2 and "Traceback" not in err, err
    missing = err.strip().splitlines()[-1]
    assert missing.startswith("error: ") and str(FIXTURE_DATA) in missing  # the folder given, its first missing file
    code, err = run_main(train_main, "--config", str(recipe), "--data-dir", str(tmp_path / "none"), capsys=capsys)
    assert code == 2 and f"data folder {tmp_path / 'none'} (--data-dir) not found" in err


def test_evaluation_reads_every_task_before_the_model_and_keeps_scores_as_they_come(
    dense_path, tmp_path, monkeypatch, capsys
):
    import moe_embed.evaluation.run

    loads = []
    original_load = moe_embed.folders.load_sentence_transformer
    monkeypatch.setattr(
        moe_embed.folders, "load_sentence_transformer", lambda *a, **k: loads.append(a) or original_load(*a, **k)
    )
    code, err = run_main(
        evaluate_main, dense_path, "--tasks", "STSBenchmark,SICK-R", "--data-dir", str(FIXTURE_DATA), capsys=capsys
    )
    assert code == 2 and "mteb/sickr-sts" in err and loads == []  # the fixture has no SICK-R: said before loading

    original = moe_embed.evaluation.run.evaluate

    def second_task_fails(model, task, *args):
        if task.metadata.name == "SciFact":
            raise KeyboardInterrupt  # the user stops the run during the second task
        return original(model, task, *args)

    monkeypatch.setattr(moe_embed.evaluation.run, "evaluate", second_task_fails)
    output = tmp_path / "scores.json"
    with pytest.raises(KeyboardInterrupt):
        evaluate_main(
            [dense_path, "--tasks", "STSBenchmark,SciFact", "--data-dir", str(FIXTURE_DATA), "--output", str(output)]
        )
    assert list(json.loads(output.read_text())) == ["STSBenchmark"]  # the first task's score was kept
    code, err = run_main(
        evaluate_main, dense_path, "--tasks", "STSBenchmark", "--data-dir", str(FIXTURE_DATA), "--output", str(output),
        capsys=capsys,
    )  # fmt: skip
    assert code == 2 and "pass --overwrite" in err  # an earlier run's scores are not replaced silently


def test_a_missing_base_is_reported_even_where_the_default_output_exists(tmp_path, monkeypatch, capsys):
    from moe_embed.convert.upcycle import main as upcycle_main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mote-minilm").mkdir(parents=True)  # the default output of an earlier run
    code, err = run_main(upcycle_main, "--base", str(tmp_path / "no-such-model"), capsys=capsys)
    assert code == 2 and f"no model folder {tmp_path / 'no-such-model'}" in err, err


def test_loading_a_mote_folder_logs_no_default_prompt_warning(mote_dir, caplog):
    from sentence_transformers import SentenceTransformer

    with caplog.at_level(logging.INFO):
        model = SentenceTransformer(mote_dir, trust_remote_code=True, device="cpu")
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
    hidden = json.loads((Path(mote_dir) / "config.json").read_text())["hidden_size"]
    assert model.encode(["a text"]).shape == (1, hidden)


def _command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    moe_embed = Path(sys.executable).parent / "moe-embed"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    env.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)  # as a user's shell has it
    return subprocess.run([str(moe_embed), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_commands_are_quiet_by_default_and_say_more_with_verbose(mote_dir, tmp_path):
    merge = _command("merge", mote_dir, "--output", str(tmp_path / "ea"), cwd=tmp_path)
    assert merge.returncode == 0, merge.stderr
    assert merge.stderr.strip() == "" and merge.stdout.startswith("wrote ")  # no library logs, no progress bars
    args = ["evaluate", mote_dir, "--trust-remote-code", "--tasks", "STSBenchmark", "--data-dir", str(FIXTURE_DATA)]
    quiet, verbose = _command(*args, cwd=tmp_path), _command(*args, "--verbose", cwd=tmp_path)
    assert quiet.returncode == verbose.returncode == 0, quiet.stderr + verbose.stderr
    assert quiet.stderr.strip().splitlines() == ["evaluating STSBenchmark", quiet.stderr.strip().splitlines()[-1]]
    assert "info (sentence_transformers" in verbose.stderr and "Loading weights" in verbose.stderr
    assert quiet.stdout == verbose.stdout  # the same scores either way


@pytest.mark.slow
def test_export_prints_its_own_steps_only(trained_mote, tmp_path):
    # randomly perturbed experts keep less in int8 than trained ones: the bound of conftest.INT8
    int8 = ["--quantize", "int8", "--int8-min-cosine", "0.9"]
    result = _command("export", str(trained_mote), "--output", str(tmp_path / "onnx"), *int8, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    # the last check is OpenVINO's int8 model (the openvino extra is installed here)
    last = "openvino/openvino_model_qint8_quantized.xml against fp32"
    assert lines[0].startswith("tracing and exporting") and lines[-1].startswith(last), lines
    assert result.stdout.strip().splitlines()[-1].startswith("wrote") and len(result.stdout.splitlines()) == 1
    assert not [line for line in lines if "warning" in line.lower() or "Loading weights" in line], lines


@pytest.mark.slow
def test_a_machine_without_the_hub_works_offline_at_once_and_says_so(dense_path, tmp_path):
    """Without HF_HUB_OFFLINE, a command on a machine that cannot reach the Hub (here: an endpoint whose port is
    closed) says once that it works offline, and then fails in one line where it needs the Hub, with no retries
    of the Hub's libraries (which retry with backoff for half a minute, each line printed twice)."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on: bound here, then closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    moe_embed = Path(sys.executable).parent / "moe-embed"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "MOE_EMBED_DATA")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp_path / "hf-home"))
    args = ["evaluate", dense_path, "--tasks", "STSBenchmark"]
    result = subprocess.run([str(moe_embed), *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert lines[0] == "127.0.0.1 cannot be reached: working offline (local folders and the cache)", lines
    assert lines[1:] == [lines[-1]] and "mteb/stsbenchmark-sts" in lines[-1], lines  # no retries, one error
    help_ = subprocess.run([str(moe_embed), "evaluate", "--help"], env=env, capture_output=True, text=True)
    assert help_.returncode == 0 and "cannot be reached" not in help_.stderr  # --help tries no connection
