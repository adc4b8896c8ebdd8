"""convert/upcycle.py as a user runs it: outputs, refusals with exit code 2, nothing half-written."""

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from conftest import read_json, run_main, run_script
from safetensors.torch import load_file

from moe_embed.convert.checkpoint import map_state_dict
from moe_embed.convert.instruction_baseline import save_dense_with_prompts
from moe_embed.convert.upcycle import main as upcycle_main
from moe_embed.errors import UsageError


def upcycle(capsys, *args) -> tuple[int, str]:
    return run_main(upcycle_main, *args, capsys=capsys)


def _tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        digest.update(str(path.relative_to(folder)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_default_run_writes_a_complete_folder(mote_dir, dense_path):
    folder = Path(mote_dir)
    names = {p.name for p in folder.iterdir()}
    expected = {
        "config.json",
        "model.safetensors",
        "README.md",
        "modules.json",
        "sentence_bert_config.json",
        "config_sentence_transformers.json",
        "st_mote.py",
        "modeling_mote.py",
        "tokenizer.json",
        "tokenizer_config.json",
        "1_Pooling",
    }
    assert expected <= names, expected - names
    assert not [n for n in names if n.endswith((".bin", ".pt", ".pkl"))]
    config = read_json(folder / "config.json")
    assert config["model_type"] == "mote_bert"
    assert config["auto_map"] == {
        "AutoConfig": "modeling_mote.MoteBertConfig",
        "AutoModel": "modeling_mote.MoteBertModel",
    }
    layers = read_json(Path(dense_path) / "config.json")["num_hidden_layers"]
    assert config["expert_layers"] == list(range(1, layers, 2)) and config["tasks"] == [
        "query",
        "document",
        "classification",
        "clustering",
    ]
    assert read_json(folder / "modules.json")[0]["type"] == "st_mote.MoteTransformer"
    # a plain encode(texts) routes to the classification expert, in transformers and Sentence-Transformers: the
    # module applies the config's default task, so the folder sets no default prompt (nothing warns on load)
    assert config["default_task"] == "classification"
    assert read_json(folder / "config_sentence_transformers.json")["default_prompt_name"] is None
    assert read_json(folder / "1_Pooling" / "config.json") == read_json(Path(dense_path) / "1_Pooling" / "config.json")
    card = (folder / "README.md").read_text()
    assert card.startswith("---\n") and "pipeline_tag: sentence-similarity" in card and "search_query: " in card
    # every expert of every expert layer is the dense FFN
    dense = load_file(str(Path(dense_path) / "model.safetensors"))
    mote = load_file(str(folder / "model.safetensors"))
    for layer in config["expert_layers"]:
        for expert in range(4):
            assert torch.equal(
                mote[f"encoder.layer.{layer}.experts.{expert}.intermediate.dense.weight"],
                dense[f"encoder.layer.{layer}.intermediate.dense.weight"],
            )
            assert torch.equal(
                mote[f"encoder.layer.{layer}.experts.{expert}.attention_LayerNorm.weight"],
                dense[f"encoder.layer.{layer}.attention.output.LayerNorm.weight"],
            )
    assert torch.equal(
        mote["encoder.layer.0.intermediate.dense.weight"], dense["encoder.layer.0.intermediate.dense.weight"]
    )


@pytest.mark.slow
def test_existing_output_is_refused_without_overwrite(mote_dir):
    before = _tree_digest(Path(mote_dir))
    result = run_script("convert/upcycle.py", "--output", mote_dir)
    assert result.returncode == 2
    assert (
        result.stderr.strip().splitlines()[-1]
        == f"error: {Path(mote_dir).resolve()} already exists; pass --overwrite to replace it"
    )
    assert "Traceback" not in result.stderr
    assert _tree_digest(Path(mote_dir)) == before


def test_overwrite_replaces_atomically(dense_path, tmp_path, capsys):
    out = tmp_path / "m"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    code, err = upcycle(
        capsys,
        "--base",
        dense_path,
        "--output",
        str(out),
        "--overwrite",
        "--expert-layers",
        "all",
        "--tasks",
        "query",
        "document",
        "--no-verify",
    )
    assert code == 0, err
    assert not (out / "stale.txt").exists()
    layers = read_json(Path(dense_path) / "config.json")["num_hidden_layers"]
    assert read_json(out / "config.json")["expert_layers"] == list(range(layers))
    assert read_json(out / "config_sentence_transformers.json")["prompts"] == {
        "query": "search_query: ",
        "document": "search_document: ",
    }
    assert _leftovers(tmp_path) == []


def test_routing_defaults_strict_and_custom(dense_path, tmp_path, capsys):
    strict = tmp_path / "strict"
    assert upcycle(capsys, "--base", dense_path, "--output", str(strict), "--strict-routing")[0] == 0
    assert read_json(strict / "config.json")["default_task"] is None
    assert read_json(strict / "config_sentence_transformers.json")["default_prompt_name"] is None
    custom = tmp_path / "custom"
    assert upcycle(capsys, "--base", dense_path, "--output", str(custom), "--default-task", "passage")[0] == 0
    assert read_json(custom / "config.json")["default_task"] == "document"
    assert read_json(custom / "config_sentence_transformers.json")["default_prompt_name"] is None
    card = (custom / "README.md").read_text()
    assert "`encode` without a prompt or task uses the `document` expert" in card


def _copy_source(dense_path: str, target: Path) -> Path:
    shutil.copytree(dense_path, target)
    return target


@pytest.mark.parametrize(
    "breakage, message",
    [
        ("architecture", "unsupported architecture model_type='gpt2'"),
        ("corrupt", "is not a readable safetensors file"),
        ("tokenizer", "has no tokenizer"),
        ("pickle", "only pickle weights"),
        ("layers", "expert_layers` holds layer indices [9]"),
        ("task", "task 'legal' needs a prefix"),
        ("bad-tokenizer", "cannot load the tokenizer of"),
        ("activation", "Unknown hidden_act 'swishy'"),
        ("output-is-source", "overlaps the input"),
        ("output-inside-source", "overlaps the input"),
        ("other-arch-flag", "--num-local-experts only applies to --arch comoe/moe"),
        ("strict-and-default", "pass --default-task or --strict-routing, not both"),
        ("unknown-default", "Unknown task 'legal'"),
        ("strict-on-moe", "--strict-routing only applies to --arch mote"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(dense_path, tmp_path, capsys, breakage, message):
    source = _copy_source(dense_path, tmp_path / "source")
    args = ["--base", str(source), "--output", str(tmp_path / "out")]
    if breakage == "architecture":
        config = read_json(source / "config.json")
        config["model_type"] = "gpt2"
        (source / "config.json").write_text(json.dumps(config))
    elif breakage == "corrupt":
        data = (source / "model.safetensors").read_bytes()
        (source / "model.safetensors").write_bytes(data[: len(data) // 3])
    elif breakage == "tokenizer":
        for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            (source / name).unlink()
    elif breakage == "pickle":
        (source / "model.safetensors").rename(source / "pytorch_model.bin")
    elif breakage == "layers":
        args += ["--expert-layers", "1,9"]
    elif breakage == "task":
        args += ["--tasks", "query", "legal"]
    elif breakage == "bad-tokenizer":
        (source / "tokenizer.json").write_text("{ not json")
        (source / "vocab.txt").unlink()
    elif breakage == "activation":
        config = read_json(source / "config.json")
        config["hidden_act"] = "swishy"
        (source / "config.json").write_text(json.dumps(config))
    elif breakage == "output-is-source":
        args = ["--base", str(source), "--output", str(source), "--overwrite"]
    elif breakage == "output-inside-source":
        args = ["--base", str(source), "--output", str(source / "sub")]
    elif breakage == "other-arch-flag":
        args += ["--num-local-experts", "4"]
    elif breakage == "strict-and-default":
        args += ["--strict-routing", "--default-task", "query"]
    elif breakage == "unknown-default":
        args += ["--default-task", "legal"]
    elif breakage == "strict-on-moe":
        args += ["--arch", "moe", "--strict-routing"]
    before = _tree_digest(source)
    code, err = upcycle(capsys, *args)
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], lines[-1]
    assert not (tmp_path / "out").exists()
    assert _leftovers(tmp_path) == []
    assert _tree_digest(source) == before  # the input is never touched


def test_missing_base_folder_and_help(dense_path, tmp_path, capsys):
    code, err = upcycle(capsys, "--base", str(tmp_path / "nonexistent"), "--output", str(tmp_path / "out"))
    assert code == 2 and "no model folder" in err.splitlines()[-1]  # a local path never goes to the Hub
    code, err = upcycle(capsys, "--base", "someone/no-such-model", "--output", str(tmp_path / "out"))
    assert code == 2 and "could not be fetched from the Hub" in err.splitlines()[-1]  # a Hub id, offline
    assert not (tmp_path / "out").exists()
    code, err = upcycle(capsys, "--base", dense_path, "--output", str(tmp_path / "out"), "--max-shard-size", "abc")
    assert code == 2 and "expected a size such as 2GB" in err
    help_text = run_script("convert/upcycle.py", "--help")
    assert help_text.returncode == 0
    for option in ("--base", "--tasks", "--expert-layers", "--output", "--overwrite", "--dtype", "--arch"):
        assert option in help_text.stdout


def test_dense_with_prompts_needs_an_expert_folder(dense_path, tmp_path):
    with pytest.raises(UsageError, match="expected an expert model folder with prompts"):
        save_dense_with_prompts(dense_path, tmp_path / "ic")  # the dense folder has no task prompts
    assert not (tmp_path / "ic").exists()


def test_map_state_dict_fails_loudly():
    shapes = {"a": torch.Size([2]), "b": torch.Size([3])}
    same = lambda key, tensor: [(key, tensor)]  # noqa: E731
    with pytest.raises(UsageError, match="shape mismatch"):
        map_state_dict({"a": torch.zeros(2), "b": torch.zeros(4)}, shapes, same)
    with pytest.raises(UsageError, match="left unmapped"):
        map_state_dict(
            {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(1)},
            shapes,
            lambda k, t: [] if k == "c" else [(k, t)],
        )
    with pytest.raises(UsageError, match="not filled"):
        map_state_dict({"a": torch.zeros(2)}, shapes, same)
    with pytest.raises(UsageError, match="two checkpoint tensors map to b"):
        map_state_dict({"a": torch.zeros(2), "b": torch.zeros(3)}, shapes, same, new_tensors={"b": torch.zeros(3)})
    assert set(map_state_dict({"a": torch.zeros(2)}, shapes, same, new_tensors={"b": torch.ones(3)})) == {"a", "b"}


def test_roberta_checkpoint_upcycles_to_its_own_function(dense_path, tmp_path, capsys, monkeypatch):
    """A RoBERTa-family source (positions offset by padding_idx + 1, one token type) maps too."""
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    from moe_embed.modeling.modeling_mote import MoteBertModel

    source = tmp_path / "roberta"
    config = RobertaConfig(
        vocab_size=30522,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=66,
        type_vocab_size=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    dense = RobertaModel(config).eval()
    dense.save_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(dense_path)
    tokenizer.save_pretrained(source)
    out = tmp_path / "mote-roberta"
    monkeypatch.chdir(tmp_path)  # a relative local --base is a folder, not a Hub id
    code, err = upcycle(capsys, "--base", "roberta", "--output", str(out), "--expert-layers", "all")
    assert code == 0, err
    card = (out / "README.md").read_text()
    assert "base_model:" not in card.split("---")[1] and "huggingface.co/roberta" not in card
    assert read_json(out / "config.json")["position_offset"] == 1
    mote = MoteBertModel.from_pretrained(out).eval()
    batch = tokenizer(["clustering: a b c", "search_query: d"], padding=True, return_tensors="pt")
    with torch.no_grad():
        diff = (mote(**batch).last_hidden_state - dense(**batch).last_hidden_state)[batch["attention_mask"].bool()]
    assert diff.abs().max() <= 1e-5


def test_sharded_source_sharded_output_and_dtype(dense_path, dense_model, tokenizer, tmp_path, capsys):
    source = tmp_path / "sharded-dense"
    dense_model.save_pretrained(source, max_shard_size="100KB")
    tokenizer.save_pretrained(source)
    assert (source / "model.safetensors.index.json").exists()
    out = tmp_path / "mote"
    code, err = upcycle(capsys, "--base", str(source), "--output", str(out), "--max-shard-size", "150KB")
    assert code == 0, err
    assert (out / "model.safetensors.index.json").exists() and len(list(out.glob("model-*.safetensors"))) > 1
    from moe_embed.modeling.modeling_mote import MoteBertModel

    mote = MoteBertModel.from_pretrained(out).eval()
    batch = tokenizer(["search_document: sharded weights"], return_tensors="pt")
    with torch.no_grad():
        assert (mote(**batch).last_hidden_state - dense_model(**batch).last_hidden_state).abs().max() <= 1e-5

    half = tmp_path / "mote-bf16"
    code, err = upcycle(capsys, "--base", dense_path, "--output", str(half), "--dtype", "bfloat16")
    assert code == 0, err
    assert {t.dtype for t in load_file(str(half / "model.safetensors")).values()} == {torch.bfloat16}
    assert read_json(half / "config.json")["dtype"] == "bfloat16"


def test_moe_folder_and_options(moe_dir, tmp_path, capsys, dense_path):
    folder = Path(moe_dir)
    config = read_json(folder / "config.json")
    assert config["model_type"] == "moe_bert" and config["auto_map"]["AutoModel"] == "modeling_moe.MoeBertModel"
    dense_config = read_json(Path(dense_path) / "config.json")
    layers = list(range(1, dense_config["num_hidden_layers"], 2))
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["moe_layers"]) == (8, 2, layers)
    assert read_json(folder / "modules.json")[0]["type"] == "st_moe.MoeTransformer"
    assert {p.name for p in folder.iterdir() if p.suffix == ".py"} == {"st_moe.py", "modeling_moe.py"}
    assert "mixture-of-experts" in (folder / "README.md").read_text()
    weights = load_file(str(folder / "model.safetensors"))
    dense = load_file(str(Path(dense_path) / "model.safetensors"))
    up = weights["encoder.layer.3.mlp.experts.up_proj"]
    hidden, intermediate = dense_config["hidden_size"], dense_config["intermediate_size"]
    assert up.shape == (8, intermediate, hidden) and all(
        torch.equal(up[e], dense["encoder.layer.3.intermediate.dense.weight"]) for e in range(8)
    )
    assert torch.equal(
        weights["encoder.layer.3.output.LayerNorm.weight"], dense["encoder.layer.3.output.LayerNorm.weight"]
    )
    assert "encoder.layer.2.intermediate.dense.weight" in weights  # dense layers keep BERT names

    out = tmp_path / "moe-noisy"
    code, err = upcycle(
        capsys,
        "--arch",
        "moe",
        "--base",
        dense_path,
        "--output",
        str(out),
        "--num-local-experts",
        "4",
        "--num-experts-per-tok",
        "1",
        "--moe-layers",
        "all",
        "--router-init",
        "zeros",
        "--expert-noise",
        "0.01",
        "--seed",
        "3",
    )
    assert code == 0, err
    noisy = load_file(str(out / "model.safetensors"))
    assert torch.equal(noisy["encoder.layer.0.mlp.router.weight"], torch.zeros(4, hidden))
    up = noisy["encoder.layer.0.mlp.experts.up_proj"]
    assert not torch.equal(up[0], up[1])
    assert (up[0] - dense["encoder.layer.0.intermediate.dense.weight"]).std().item() == pytest.approx(0.01, rel=0.05)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-experts-per-tok", "9"], "num_experts_per_tok` (9) must lie in 1..num_local_experts (8)"),
        (["--moe-layers", "6"], "moe_layers` holds layer indices [6] out of range"),
        (["--expert-noise", "-1"], "--expert-noise must be >= 0"),
    ],
)
def test_moe_bad_options(dense_path, tmp_path, capsys, args, message):
    code, err = upcycle(capsys, "--arch", "moe", "--base", dense_path, "--output", str(tmp_path / "out"), *args)
    assert code == 2 and message in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []
