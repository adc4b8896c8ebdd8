"""Training CoMoE and the plain LoRA baseline through moe_embed.training.train: only adapters change."""

import json
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from moe_embed.errors import UsageError
from moe_embed.training.config import TrainingConfig, from_mapping
from moe_embed.training.train import main as train_main

ADAPTER_SUFFIXES = (".lora_A", ".lora_B", ".router.weight")


def _config(tmp_path, **settings):
    rows = [{"anchor": f"question number {i}", "positive": f"the answer to question {i}"} for i in range(16)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = {
        "output_dir": str(tmp_path / "out"),
        "batch_size": 4,
        "max_steps": 3,
        "learning_rate": 1e-3,
        "tasks": {"retrieval": [{"name": "pairs", "path": str(tmp_path / "pairs.jsonl")}]},
        **settings,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_comoe_training_changes_only_adapters(tmp_path, dense_path):
    from moe_embed.convert.upcycle import main as upcycle_main

    train_main(["--config", str(_config(tmp_path, model=dense_path, arch="comoe", seed=3))])
    trained = load_file(str(tmp_path / "out" / "model.safetensors"))
    dense = load_file(str(Path(dense_path) / "model.safetensors"))
    initial_dir = tmp_path / "initial"  # the same upcycling the run started from (same options and seed)
    upcycle_main(["--arch", "comoe", "--base", dense_path, "--output", str(initial_dir), "--seed", "3"])
    initial = load_file(str(initial_dir / "model.safetensors"))
    assert set(trained) == set(initial)
    for key, tensor in trained.items():
        if key.endswith(ADAPTER_SUFFIXES):
            continue
        assert torch.equal(tensor, dense[key]), key  # the frozen base, bit for bit
    for suffix in ADAPTER_SUFFIXES:
        keys = [k for k in trained if k.endswith(suffix)]
        layers = json.loads((Path(dense_path) / "config.json").read_text())["num_hidden_layers"]
        assert len(keys) == 4 * layers and all(not torch.equal(trained[k], initial[k]) for k in keys), suffix
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "comoe_bert" and config["contrastive_loss_coef"] == 0.01


@pytest.mark.slow
def test_comoe_folder_trains_and_saves_adapter_only(tmp_path, comoe_dir, dense_path):
    from moe_embed.modeling.modeling_comoe import CoMoeBertModel

    path = _config(tmp_path, model=comoe_dir, trust_remote_code=True, save_adapter_only=True)
    trained_model = train_main(["--config", str(path)])
    upcycled = CoMoeBertModel.from_pretrained(comoe_dir)
    # the adapter-only folder cannot show the base: check the trained model itself kept it
    for name, param in trained_model[0].auto_model.named_parameters():
        if not name.endswith(ADAPTER_SUFFIXES):
            assert not param.requires_grad and torch.equal(param, upcycled.get_parameter(name)), name
    out = tmp_path / "out"
    assert not (out / "model.safetensors").exists()
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert tensors and all(k.startswith("base_model.model.") and k.endswith(ADAPTER_SUFFIXES) for k in tensors)
    # the adapter names the base the CoMoE folder names (a local folder by its path, the bundled MiniLM by its Hub id:
    # then, offline, the local copy is named at load time, as here)
    base = json.loads((Path(comoe_dir) / "config.json").read_text())["base_model_name_or_path"]
    named = json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (out / named).resolve() == Path(base).resolve()  # relative to the adapter folder: it survives a move
    model = CoMoeBertModel.from_pretrained(str(out), base_model_name_or_path=dense_path)
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, upcycled.get_parameter(n))]
    assert changed and all(n.endswith(ADAPTER_SUFFIXES) for n in changed)


@pytest.mark.slow
def test_lora_baseline_is_saved_merged_as_a_plain_model(tmp_path, dense_path):
    from transformers import AutoModel, BertModel

    settings = {
        "model": dense_path,
        "arch": "lora",
        "adapter": {"lora_rank": 4, "target_modules": "value,output.dense"},
    }
    train_main(["--config", str(_config(tmp_path, **settings))])
    out = tmp_path / "out"
    trained = load_file(str(out / "model.safetensors"))
    dense = load_file(str(Path(dense_path) / "model.safetensors"))
    changed = {k for k in trained if not torch.equal(trained[k], dense[k])}
    # 'output.dense' selects both output projections (peft's rule), 'value' the value projection
    expected = {
        f"encoder.layer.{i}.{name}.weight"
        for i in range(json.loads((Path(dense_path) / "config.json").read_text())["num_hidden_layers"])
        for name in ("attention.self.value", "attention.output.dense", "output.dense")
    }
    assert changed == expected
    assert type(AutoModel.from_pretrained(str(out))) is BertModel  # no remote code, no peft


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"arch": "mixtral"}, "unknown arch 'mixtral'; expected one of mote, moe, comoe, lora"),
        ({"arch": "lora", "save_adapter_only": True}, "save_adapter_only applies to CoMoE"),
        ({"adapter": {"lora_rank": 0}}, "adapter.lora_rank must be a positive integer"),
        (
            {"adapter": {"local_experts": 3}},
            "unknown key 'local_experts' in adapter; did you mean 'num_local_experts'?",
        ),
        # the names before the config's: each says what it is now
        ({"adapter": {"rank": 4}}, "adapter: 'rank' is now 'lora_rank'"),
        ({"adapter": {"layers": "all"}}, "adapter: 'layers' is now 'adapter_layers'"),
        ({"adapter": {"num_experts": 4}}, "adapter: 'num_experts' is now 'num_local_experts'"),
        ({"adapter": {"experts_per_token": 1}}, "adapter: 'experts_per_token' is now 'num_experts_per_tok'"),
    ],
)
def test_adapter_config_errors(settings, message):
    base = {"model": "m", "tasks": {"retrieval": [{"path": "x.jsonl"}]}}
    with pytest.raises(UsageError, match=message):
        from_mapping(TrainingConfig, {**base, **settings})


def test_save_adapter_only_needs_a_comoe_model(tmp_path, dense_path):
    with pytest.raises(UsageError, match="save_adapter_only needs a CoMoE model; this one is 'bert'"):
        train_main(["--config", str(_config(tmp_path, model=dense_path, save_adapter_only=True))])
