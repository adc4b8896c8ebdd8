"""convert/merge_experts.py: Expert Averaging and per-task export to plain dense models."""

from pathlib import Path

import pytest
import torch
from conftest import TEXTS, read_json, run_isolated, run_main, save_trained_copy
from safetensors.torch import load_file
from sentence_transformers import SentenceTransformer

from moe_embed.convert.merge_experts import check_task_names
from moe_embed.convert.merge_experts import main as merge_main
from moe_embed.errors import UsageError

PLAIN_LOAD = """
import json, sys
from sentence_transformers import SentenceTransformer
from transformers import AutoModel
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(folder)              # no trust_remote_code
assert type(model).__name__ == "BertModel", type(model)
st = SentenceTransformer(folder)                       # no trust_remote_code
result = {"default": st.encode(texts).tolist(), "prompts": st.prompts, "default_prompt": st.default_prompt_name}
print(json.dumps(result))
"""


def merge(capsys, *args) -> tuple[int, str]:
    return run_main(merge_main, *args, capsys=capsys)


def _dense_weights(dense_path):
    return {k: v for k, v in load_file(str(Path(dense_path) / "model.safetensors")).items() if "position_ids" not in k}


def test_expert_averaging_of_untrained_mote_is_the_dense_model(mote_dir, dense_path, tmp_path, capsys):
    out = tmp_path / "ea"
    code, err = merge(capsys, mote_dir, "--output", str(out))
    assert code == 0, err
    merged, dense = load_file(str(out / "model.safetensors")), _dense_weights(dense_path)
    assert merged.keys() == dense.keys()
    assert all(torch.equal(merged[k], dense[k]) for k in dense)
    # a plain `encode` means what it means on the MoTE folder: nothing is added to the row (no default prompt)
    assert read_json(out / "config_sentence_transformers.json")["default_prompt_name"] is None
    config = read_json(out / "config.json")
    assert config["model_type"] == "bert" and config["architectures"] == ["BertModel"] and "auto_map" not in config
    assert not list(out.glob("*.py"))
    ea = SentenceTransformer(str(out))
    reference = SentenceTransformer(dense_path)
    # the weights are equal (above); the outputs may differ in the last bit where the two copies of the
    # weights sit at different memory alignments (BLAS kernels may take other paths)
    torch.testing.assert_close(
        ea.encode(TEXTS, prompt_name="query", convert_to_tensor=True),
        reference.encode(["search_query: " + t for t in TEXTS], convert_to_tensor=True),
        rtol=0,
        atol=1e-6,
    )
    # a plain `encode` is the dense model's on the texts as they are, as the MoTE folder's plain `encode` is
    plain = ea.encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(plain, reference.encode(TEXTS, convert_to_tensor=True), rtol=0, atol=1e-6)
    mote = SentenceTransformer(mote_dir, trust_remote_code=True)
    torch.testing.assert_close(plain, mote.encode(TEXTS, convert_to_tensor=True), rtol=0, atol=1e-5)
    with_prompt = ea.encode(TEXTS, prompt_name="Clustering", convert_to_tensor=True)
    assert (with_prompt - plain).abs().max() > 1e-3  # a named prompt is still put in front


def test_expert_averaging_of_trained_experts_is_the_hand_average(mote_dir, tmp_path, capsys):
    trained = tmp_path / "trained"
    model = save_trained_copy(mote_dir, trained, seed=7)
    out = tmp_path / "ea"
    code, err = merge(capsys, str(trained), "--output", str(out), "--experts", "clustering,passage", "--weights", "3,1")
    assert code == 0, err
    merged = load_file(str(out / "model.safetensors"))
    layer = model.encoder.layer[3]
    clustering, document = layer.experts["3"], layer.experts["1"]
    expected = {
        "encoder.layer.3.intermediate.dense.weight": 0.75 * clustering.intermediate.dense.weight
        + 0.25 * document.intermediate.dense.weight,
        "encoder.layer.3.attention.output.LayerNorm.bias": 0.75 * clustering.attention_LayerNorm.bias
        + 0.25 * document.attention_LayerNorm.bias,
        "encoder.layer.3.output.LayerNorm.weight": 0.75 * clustering.output.LayerNorm.weight
        + 0.25 * document.output.LayerNorm.weight,
    }
    for key, value in expected.items():
        assert torch.allclose(merged[key], value.detach(), atol=1e-6), key
    assert torch.equal(
        merged["encoder.layer.2.intermediate.dense.weight"], model.encoder.layer[2].intermediate.dense.weight
    )


@pytest.mark.slow
def test_task_export_equals_mote_routed_to_that_task_without_remote_code(mote_dir, tmp_path, capsys):
    import json

    trained = tmp_path / "trained"
    save_trained_copy(mote_dir, trained, seed=11)
    st = SentenceTransformer(str(trained), trust_remote_code=True)
    out = tmp_path / "clustering"
    code, err = merge(capsys, str(trained), "--task", "clustering", "--output", str(out))
    assert code == 0, err
    result = json.loads(run_isolated(PLAIN_LOAD, str(out), json.dumps(TEXTS)).splitlines()[-1])
    assert result["default_prompt"] is None  # a plain encode adds nothing, as the MoTE folder's does
    expected = st.encode(TEXTS, task="clustering", convert_to_tensor=True)
    assert (torch.tensor(result["default"]) - expected).abs().max() <= 1e-5
    # and it is not what another task's experts give
    other = st.encode(TEXTS, task="query", convert_to_tensor=True)
    assert (torch.tensor(result["default"]) - other).abs().max() > 1e-3


def test_task_export_keeps_only_its_task_prompts_and_is_tagged_as_one_task(mote_dir, tmp_path, capsys):
    """A one-task export offers only the prompts of its task: another task's prompt would run these experts with
    that task's prefix, in silence. Its card says what it is (`task-expert`), not Expert Averaging."""
    from huggingface_hub import ModelCard

    code, err = merge(capsys, mote_dir, "--task", "document", "--output", str(tmp_path / "document"))
    assert code == 0, err
    settings = read_json(tmp_path / "document" / "config_sentence_transformers.json")
    assert settings["prompts"] == {"document": "search_document: "}
    assert settings["default_prompt_name"] is None
    tags = ModelCard.load(tmp_path / "document" / "README.md").data.tags
    assert "task-expert" in tags and "expert-averaging" not in tags and "mote" in tags
    code, err = merge(capsys, mote_dir, "--output", str(tmp_path / "ea"))
    assert code == 0, err
    tags = ModelCard.load(tmp_path / "ea" / "README.md").data.tags
    assert "expert-averaging" in tags and "task-expert" not in tags
    every = read_json(Path(mote_dir) / "config_sentence_transformers.json")["prompts"]
    assert read_json(tmp_path / "ea" / "config_sentence_transformers.json")["prompts"] == every
    card = (tmp_path / "ea" / "README.md").read_text()
    assert "plain `encode(texts)` adds nothing" in card and "uses the" not in card  # no default prompt announced


@pytest.mark.slow
def test_moe_expert_averaging(moe_dir, dense_path, tmp_path, capsys):
    out = tmp_path / "moe-ea"
    code, err = merge(capsys, moe_dir, "--output", str(out))
    assert code == 0, err
    merged, dense = load_file(str(out / "model.safetensors")), _dense_weights(dense_path)
    assert merged.keys() == dense.keys() and all(torch.equal(merged[k], dense[k]) for k in dense)

    # router-usage weights on a calibration text, with a subset of experts
    trained = tmp_path / "trained"
    model = save_trained_copy(moe_dir, trained, seed=2)
    texts = tmp_path / "calibration.txt"
    texts.write_text("\n".join(TEXTS * 3) + "\n")
    out = tmp_path / "moe-usage"
    code, err = merge(capsys, str(trained), "--output", str(out), "--calibration", str(texts), "--experts", "0,1,2,3")
    assert code == 0, err
    merged = load_file(str(out / "model.safetensors"))
    up = model.encoder.layer[1].mlp.experts.up_proj.detach()
    uniform = up[:4].mean(0)
    # usage-weighted: a convex combination of experts 0-3 that is not their plain mean
    assert not torch.allclose(merged["encoder.layer.1.intermediate.dense.weight"], uniform, atol=1e-7)
    assert "encoder.layer.1.mlp.router.weight" not in merged


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "legal"], "Unknown task 'legal'. Valid tasks: 'query' (prefix 'search_query: ')"),
        (["--experts", "query,query"], "names a task twice"),
        (["--weights", "1,2"], "--weights has 2 values for 4 experts"),
        (["--task", "query", "--experts", "document"], "pass --task or --experts, not both"),
        (["--calibration", "x.txt"], "MoTE routes by task"),
    ],
)
def test_bad_input(mote_dir, tmp_path, capsys, args, message):
    code, err = merge(capsys, mote_dir, "--output", str(tmp_path / "out"), *args)
    assert code == 2 and message in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


def test_the_early_task_check_takes_the_names_the_model_takes():
    """`merge --task` is checked against config.json before the model loads, by the config's own lookup: a task in
    another case, as mteb spells task types, passes the check as it passes the model; an unknown one is refused."""
    config = {"tasks": ["query", "classification"], "task_prefixes": {"query": "q: ", "classification": "c: "}}
    config["task_aliases"] = {"passage": "query"}
    check_task_names(config, ["Classification", "QUERY", "passage"])
    with pytest.raises(UsageError, match=r"Unknown task 'legal'\. Valid tasks: 'query' \(prefix 'q: '\)"):
        check_task_names(config, ["query", "legal"])


def test_refusals(mote_dir, dense_path, tmp_path, capsys):
    code, err = merge(capsys, dense_path, "--output", str(tmp_path / "out"))
    assert code == 2 and "expected a MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder" in err
    code, err = merge(capsys, str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"))
    assert code == 2 and "no model folder" in err
    (tmp_path / "empty").mkdir()
    code, err = merge(capsys, str(tmp_path / "empty"), "--output", str(tmp_path / "out"))
    assert code == 2 and "is not a model folder (no config.json)" in err
    (tmp_path / "exists").mkdir()
    code, err = merge(capsys, mote_dir, "--output", str(tmp_path / "exists"))
    assert code == 2 and "already exists; pass --overwrite" in err
