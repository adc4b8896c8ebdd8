"""`convert/calibrate_aea.py`: calibrated folders that embed with AEA anywhere, and bad input."""

import json
from pathlib import Path

import pytest
import torch
from conftest import TEXTS, run_isolated, run_main, tiny_family_model

from moe_embed.convert.aea_calibration import PROMPT_EOL, embed
from moe_embed.convert.calibrate_aea import main as calibrate_main
from moe_embed.convert.upcycle import main as upcycle_main
from moe_embed.modeling.aea_controller import AdaptiveExpertAllocation

CALIBRATION = [
    "A man is playing a guitar.",
    "A woman is slicing an onion.",
    "Stocks fell sharply on Monday after the report.",
    "The cat sat on the mat.",
]


@pytest.fixture(scope="module")
def olmoe_dir(tmp_path_factory, dense_path) -> str:
    """A tiny random OLMoE with the tiny model's tokenizer (a decoder family of transformers)."""
    from transformers import AutoTokenizer

    folder = tmp_path_factory.mktemp("olmoe")
    tiny_family_model("olmoe", "grouped_mm", vocab_size=30522).save_pretrained(folder)
    AutoTokenizer.from_pretrained(dense_path).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def noisy_moe_dir(tmp_path_factory, dense_path) -> str:
    """The tiny model upcycled to the token-routed MoE with expert noise, so that its experts differ."""
    folder = tmp_path_factory.mktemp("moe-noise") / "moe"
    upcycle_main(
        [
            "--base",
            dense_path,
            "--arch",
            "moe",
            "--num-local-experts",
            "4",
            "--expert-noise",
            "0.05",
            "--output",
            str(folder),
        ]
    )
    return str(folder)


@pytest.fixture(scope="module")
def calibration_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("calibration") / "texts.txt"
    path.write_text("\n".join(CALIBRATION) + "\n", encoding="utf-8")
    return str(path)


def read_config(folder: Path) -> dict:
    return json.loads((Path(folder) / "aea_config.json").read_text())


def in_process_embeddings(source: str, config: dict, texts: list[str]) -> torch.Tensor:
    """The embeddings the calibrated settings give on the source model, computed in this process, normalised as the
    folder's `Normalize` module does."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(source, trust_remote_code=True, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(source)
    controller = AdaptiveExpertAllocation(
        model, config["layer_top_k"], config["token_wise"], config["rounding"], config["exit_layer"]
    )
    raw = embed(controller, tokenizer, texts, config["prompt_template"], config["pooling"], config["embedding"])
    return torch.nn.functional.normalize(raw, dim=-1)


LOAD_IN_FRESH_PROCESS = """
import json, sys
from sentence_transformers import SentenceTransformer
model = SentenceTransformer(sys.argv[1], trust_remote_code=True)
print(json.dumps(model.encode(json.loads(sys.argv[2]), batch_size=2).tolist()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("embedding", ["hidden", "moee-sum"])
def test_calibrated_decoder_folder_loads_in_a_fresh_process(olmoe_dir, calibration_file, tmp_path, capsys, embedding):
    output = tmp_path / "aea"
    calibrate_main([
        olmoe_dir,
        "--output", str(output),
        "--calibration", calibration_file,
        "--alpha", "4",
        "--embedding", embedding,
        "--rounding", "largest-remainder",
    ])  # fmt: skip
    printed = capsys.readouterr().out
    config = read_config(output)
    assert config["prompt_template"] == PROMPT_EOL and config["pooling"] == "last"
    assert config["exit_layer"] == 3 and config["layer_top_k"][3] == 0  # penultimate of 4 layers
    assert sum(config["layer_top_k"]) == 2 * 4  # the whole budget, on the three kept layers
    assert len(config["homogeneity"]) == 4 and "homogeneity" in printed
    assert (output / "aea_allocation.png").stat().st_size > 0
    assert "adaptive expert allocation" in (output / "README.md").read_text()
    fresh = torch.tensor(json.loads(run_isolated(LOAD_IN_FRESH_PROCESS, str(output), json.dumps(TEXTS))))
    expected = in_process_embeddings(olmoe_dir, config, TEXTS)
    assert fresh.shape == expected.shape == (len(TEXTS), 32 + (3 * 8 if embedding == "moee-sum" else 0))
    torch.testing.assert_close(fresh, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_calibrated_encoder_folder_loads_in_a_fresh_process(noisy_moe_dir, calibration_file, tmp_path, capsys):
    output = tmp_path / "aea"
    code, _ = run_main(
        calibrate_main, noisy_moe_dir, "--output", str(output), "--calibration", calibration_file, capsys=capsys
    )
    assert code == 0
    config = read_config(output)
    layers = json.loads((Path(noisy_moe_dir) / "config.json").read_text())["num_hidden_layers"]
    assert config["pooling"] == "mean" and config["exit_layer"] == layers  # encoders embed their last layer
    assert config["prompt_template"] == "classification: [TEXT]"  # the folder's similarity prompt
    assert [k is None for k in config["layer_top_k"]] == [True, False] * (layers // 2)  # MoE every other layer
    assert all(s is None or s < 0.999 for s in config["homogeneity"])  # the noise made experts differ
    fresh = torch.tensor(json.loads(run_isolated(LOAD_IN_FRESH_PROCESS, str(output), json.dumps(TEXTS))))
    torch.testing.assert_close(fresh, in_process_embeddings(noisy_moe_dir, config, TEXTS), atol=1e-5, rtol=1e-5)


def test_allocation_none_is_the_unmodified_model(olmoe_dir, calibration_file, tmp_path, capsys):
    """The baseline folder embeds the unmodified model's hidden state at the exit layer."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    output = tmp_path / "hs"
    args = ("--calibration", calibration_file, "--allocation", "none", "--exit-layer", "2")
    code, _ = run_main(calibrate_main, olmoe_dir, "--output", str(output), *args, capsys=capsys)
    assert code == 0
    config = read_config(output)
    assert config["layer_top_k"] == [2, 2, 0, 0] and config["token_wise"] is False
    embeddings = SentenceTransformer(str(output), trust_remote_code=True).encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(len(TEXTS)))  # unit vectors, as every folder's
    model = AutoModel.from_pretrained(olmoe_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(olmoe_dir)
    for row, text in enumerate(TEXTS):
        batch = tokenizer([PROMPT_EOL.replace("[TEXT]", text)], return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch, output_hidden_states=True).hidden_states[2]  # output of layer 2
        expected = torch.nn.functional.normalize(hidden[0, -1], dim=-1)  # the folder's embeddings are unit vectors
        torch.testing.assert_close(embeddings[row], expected, atol=1e-5, rtol=1e-5)


def write_sts_dev(data: Path, rows: list[tuple[float, str, str]]) -> None:
    """A data folder whose copy of mteb/stsbenchmark-sts (Hub layout) has these validation rows."""
    folder = data / "mteb" / "stsbenchmark-sts"
    folder.mkdir(parents=True)
    (folder / "validation.jsonl").write_text(
        "".join(json.dumps({"sentence1": a, "sentence2": b, "score": s}) + "\n" for s, a, b in rows)
    )
    (folder / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n  - split: validation\n    path: validation.jsonl\n---\n"
    )


def test_search_picks_alpha_and_exit_layer_on_dev_pairs(olmoe_dir, tmp_path, capsys):
    data = tmp_path / "data"
    write_sts_dev(data, [(i % 5, f"{CALIBRATION[i % 4]} {i}", CALIBRATION[(i + i // 4) % 4]) for i in range(12)])
    output = tmp_path / "aea"
    grid = ("--alphas", "0,5", "--exit-layers", "2,3")
    calibrate_main([olmoe_dir, "--output", str(output), "--search", *grid, "--data-dir", str(data)])
    printed = capsys.readouterr().out
    config = read_config(output)
    assert len(config["search"]) == 4
    chosen = config["search"][f"alpha={config['alpha']:g},exit={config['exit_layer']}"]
    assert chosen == max(config["search"].values())  # the best dev score (ties may go either way)
    assert "chose alpha" in printed


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--alpha", "-1"], "--alpha must be >= 0"),
        (["--exit-layer", "5"], "--exit-layer must lie in 1..4"),
        (["--exit-layer", "0"], "--exit-layer must lie in 1..4"),
        (["--prompt", "no placeholder"], "[TEXT]"),
        (["--embedding", "concat"], "invalid choice: 'concat'"),
    ],
)
def test_bad_settings_exit_2_and_write_nothing(olmoe_dir, calibration_file, tmp_path, capsys, arguments, message):
    output = tmp_path / "aea"
    code, printed = run_main(
        calibrate_main, olmoe_dir, "--output", str(output), "--calibration", calibration_file, *arguments, capsys=capsys
    )
    assert code == 2 and message in printed and not output.exists()


def test_dense_and_unsupported_models_are_refused(dense_path, mote_dir, calibration_file, tmp_path, capsys):
    for source in (dense_path, mote_dir):
        output = tmp_path / "aea"
        code, printed = run_main(
            calibrate_main, source, "--output", str(output), "--calibration", calibration_file, capsys=capsys
        )
        assert code == 2 and "AEA supports: deepseek_v2" in printed and not output.exists()


def test_existing_output_needs_overwrite(olmoe_dir, calibration_file, tmp_path, capsys):
    output = tmp_path / "aea"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    code, printed = run_main(
        calibrate_main, olmoe_dir, "--output", str(output), "--calibration", calibration_file, capsys=capsys
    )
    assert code == 2 and "--overwrite" in printed and (output / "keep.txt").read_text() == "mine"


def test_search_refuses_a_grid_the_homogeneity_rules_out_before_scoring_any(olmoe_dir, tmp_path, capsys):
    """With shift -1 no layer has a positive share for α > 0 (homogeneity is a cosine, never below -1):
    known once homogeneity is measured, so the run stops there, before the first (slow) dev scoring."""
    data = tmp_path / "data"
    write_sts_dev(data, [(i, CALIBRATION[i], CALIBRATION[3 - i]) for i in range(4)])
    output = tmp_path / "aea"
    code, err = run_main(
        calibrate_main, olmoe_dir, "--output", str(output), "--search", "--alphas", "0,1", "--shift", "-1",
        "--data-dir", str(data), capsys=capsys,
    )  # fmt: skip
    assert code == 2 and "is not above any kept layer's homogeneity" in err.strip().splitlines()[-1]
    assert "expert homogeneity" in err  # the progress bar of the long pass
    assert "search: alpha" not in err and not output.exists()  # α = 0 was not scored first
