"""convert/export_onnx.py: portable ONNX folders whose graphs route and embed as the PyTorch model does, fed as
a client feeds them (the folder's `tokenizer.json` alone), on batches unlike their example input."""

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from conftest import (
    TEXTS,
    client_feed,
    export_onnx_folder,
    read_json,
    run_isolated,
    run_main,
    save_trained_copy,
    tiny_family_model,
    tiny_mote_config,
    upcycled,
)
from sentence_transformers import SentenceTransformer
from sentence_transformers.models import Pooling

from moe_embed.convert.export_onnx import main as export_main
from moe_embed.convert.onnx_graph import SentenceEmbeddingGraph, export_graph

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # over any folder's max_seq_length here


def export(capsys, *args) -> tuple[int, str]:
    return run_main(export_main, *args, capsys=capsys)


def run(folder: Path, feeds: dict, file: str = "onnx/model.onnx") -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(folder / file), providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    return session.run(None, {k: np.asarray(v, dtype=np.int64) for k, v in feeds.items() if k in names})


def test_routed_mote_folder_is_the_portable_contract(trained_mote, mote_onnx):
    session = onnxruntime.InferenceSession(str(mote_onnx / "onnx" / "model.onnx"))
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    assert [o.name for o in session.get_outputs()][:2] == ["sentence_embedding", "last_hidden_state"]
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    # one length everywhere: a client truncates where sentence-transformers does, prompt included
    expected_length = st.max_seq_length
    assert read_json(mote_onnx / "sentence_bert_config.json")["max_seq_length"] == expected_length
    assert read_json(mote_onnx / "tokenizer_config.json")["model_max_length"] == expected_length
    tokenizer = json.loads((mote_onnx / "tokenizer.json").read_text())
    assert tokenizer["truncation"]["max_length"] == expected_length
    assert tokenizer["padding"]["strategy"] == "BatchLongest"
    assert read_json(mote_onnx / "config_sentence_transformers.json")["prompts"] == st.prompts
    for name in ("config.json", "special_tokens_map.json", "modules.json", "1_Pooling/config.json"):
        assert (mote_onnx / name).is_file(), name


@pytest.mark.parametrize("folder", ["mote_onnx", "moe_onnx", "comoe_onnx"])
def test_an_exported_folder_is_a_hugging_face_folder(folder, request):
    """transformers loads the folder's config and tokenizer with no remote code (the model code is not in the
    folder, and the graph is what a BERT's inputs and sizes say), and nothing in it names a file that is not
    there: sentence-transformers' ONNX backend, optimum and transformers.js read these files."""
    from transformers import AutoConfig, AutoTokenizer

    folder = request.getfixturevalue(folder)
    config = read_json(folder / "config.json")
    assert "auto_map" not in config and config["model_type"] == "bert"
    loaded = AutoConfig.from_pretrained(str(folder))  # no trust_remote_code: nothing to run
    assert loaded.hidden_size == read_json(folder / "onnx_config.json")["dimension"]
    client = client_feed(folder, ["a text"])["input_ids"][0].tolist()
    assert AutoTokenizer.from_pretrained(str(folder))("a text")["input_ids"] == client
    for module in read_json(folder / "modules.json"):
        assert module["type"].startswith("sentence_transformers.models."), module  # every version's path
        assert (folder / module["path"]).is_dir(), module
    assert set(read_json(folder / "sentence_bert_config.json")) == {"max_seq_length", "do_lower_case"}
    graph = onnx.load(str(folder / "onnx" / "model.onnx"), load_external_data=False).graph
    assert "last_hidden_state" in [o.name for o in graph.output]  # the name optimum and clients read


def test_routed_mote_graph_embeds_as_encode_for_every_prompt_and_none(trained_mote, mote_onnx):
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    tasks = st[0].auto_model.config.tasks
    # every task mixed in one padded batch, a long text, and texts without a prompt (the default task, the text
    # as it is)
    names = ["Clustering", "query", "document", "Classification", "query", None, None, "document"]
    texts = [TEXTS[i % len(TEXTS)] for i in range(5)] + ["hi", LONG, LONG]
    sent = [(st.prompts[n] if n else "") + t for n, t in zip(names, texts, strict=True)]
    feed = client_feed(mote_onnx, sent)
    sentence, tokens, routed = run(mote_onnx, feed)
    default = st[0].auto_model.config.default_task
    assert routed.tolist() == [tasks.index((n or default).lower()) for n in names]
    expected = np.stack([st.encode([t], prompt_name=n)[0] for n, t in zip(names, texts, strict=True)])
    assert np.abs(sentence - expected).max() <= 1e-4
    # the token states line up with the client's own mask: nothing was put in or taken off
    assert tokens.shape[:2] == feed["input_ids"].shape and feed["attention_mask"].sum(1).max() == st.max_seq_length
    # a frozen graph would give every row the example's expert: the experts really differ here
    other = st.encode([texts[1]], prompt_name="Clustering")
    assert np.abs(other[0] - expected[1]).max() > 1e-3


def test_prefix_routed_folder_embeds_as_encode(dense_path, tmp_path, capfd):
    """A `--prefix-routes-only` folder (what the training recipe writes): the graph reads each row without its
    prompt, as encode does, and a long text is cut where encode cuts it.
    The export is quiet: the tracer reports no data-dependent guard (it would dump the whole traced program)."""
    from conftest import save_trained_copy

    from moe_embed.convert.upcycle import main as upcycle

    upcycle(["--prefix-routes-only", "--base", dense_path, "--output", str(tmp_path / "mote")])
    save_trained_copy(str(tmp_path / "mote"), tmp_path / "trained", seed=7)
    capfd.readouterr()
    code, err = export(capfd, str(tmp_path / "trained"), "--output", str(tmp_path / "onnx"))
    assert code == 0, err
    assert "def forward(" not in err and "Unable to find user code" not in err, err[:2000]
    st = SentenceTransformer(str(tmp_path / "trained"), trust_remote_code=True)
    for name in [*st.prompts, None]:
        texts = [LONG, TEXTS[0]]
        sentence = run(
            tmp_path / "onnx", client_feed(tmp_path / "onnx", [(st.prompts[name] if name else "") + t for t in texts])
        )[0]
        assert np.abs(sentence - st.encode(texts, prompt_name=name)).max() <= 1e-4, name


def test_task_export_is_a_plain_graph(trained_mote, tmp_path, capsys):
    out = tmp_path / "query-onnx"
    code, err = export(capsys, str(trained_mote), "--task", "passage", "--output", str(out))
    assert code == 0, err
    config = read_json(out / "onnx_config.json")
    assert config["inputs"] == ["input_ids", "attention_mask", "token_type_ids"]
    assert config["exported_task"] == "document"
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    # every row reaches the document expert, which reads what the client sent: its prompt, or none
    for prompt, expected in [
        ("search_document: ", st.encode_document(TEXTS)),
        ("", st.encode(TEXTS, task="document")),
        ("search_query: ", st.encode(TEXTS, prompt_name="query", task="document")),
    ]:
        sentence = run(out, client_feed(out, [prompt + t for t in TEXTS]))[0]
        assert np.abs(sentence - expected).max() <= 1e-4, prompt


def test_onnx_folder_readme_embeds_without_torch(trained_mote, mote_onnx):
    """The README's snippet, run where torch cannot be imported, gives `encode`'s embedding of its text."""
    readme = (mote_onnx / "README.md").read_text()
    snippet = readme.split("```python\n")[1].split("```")[0]
    code = "import sys, os, json\nsys.modules['torch'] = None\nos.chdir(sys.argv[1])\n"
    code += snippet + "print(json.dumps({'texts': texts, 'embeddings': embeddings.tolist()}))\n"
    out = json.loads(run_isolated(code, str(mote_onnx)).splitlines()[-1])
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    assert np.abs(np.array(out["embeddings"]) - st.encode(out["texts"])).max() <= 1e-4


@pytest.mark.parametrize("variant", ["avx512_vnni", "avx2"])
def test_int8_graph_agrees_with_fp32_as_its_card_states(variant, trained_mote, mote_onnx):
    from moe_embed.convert.onnx_int8 import agreement_texts, row_cosines

    recorded = read_json(mote_onnx / "onnx_config.json")["int8"]["variants"][variant]
    card = (mote_onnx / "README.md").read_text()
    assert f"| {variant} | `{recorded['file']}` | {recorded['weights']} | {recorded['min_cosine']:.4f}" in card
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    texts = agreement_texts(st.prompts)[::5]
    int8 = run(mote_onnx, client_feed(mote_onnx, texts), recorded["file"])[0]
    cos = row_cosines(int8, np.stack([st.encode([t])[0] for t in texts]))
    assert cos.min() >= recorded["min_cosine"] - 1e-3 >= 0.9 - 1e-3


@pytest.mark.parametrize(
    "implementation", ["eager", *[pytest.param(i, marks=pytest.mark.slow) for i in ("grouped_mm", "batched_mm")]]
)
def test_moe_graph_keeps_padding_and_routing(implementation, tmp_path):
    """Traced on an unpadded batch, the graph still masks padding and routes every token of other batches."""
    model = tiny_family_model("moe_bert", experts_implementation=implementation).eval()
    graph = SentenceEmbeddingGraph(model, [Pooling(model.config.hidden_size)])
    example = {"input_ids": torch.randint(5, 120, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    export_graph(graph, example, tmp_path / "onnx" / "model.onnx", None)
    ids = torch.randint(5, 120, (3, 11))
    mask = torch.tensor([[1] * 11, [1] * 4 + [0] * 7, [1] * 9 + [0] * 2])
    got = run(tmp_path, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        expected = graph(ids, mask)
    real = mask.bool().numpy()
    assert np.abs(got[0] - expected[0].numpy()).max() <= 1e-4
    assert np.abs(got[1][real] - expected[1].numpy()[real]).max() <= 1e-4


def test_task_ids_input_and_strict_mote_graph_marks_unrouted_rows_nan(tokenizer, tmp_path):
    from moe_embed.modeling.modeling_mote import MoteBertModel

    model = MoteBertModel(tiny_mote_config()).eval()  # no default task
    graph = SentenceEmbeddingGraph(model, [Pooling(model.config.hidden_size)])
    prefixed = tokenizer("search_query: who")["input_ids"]  # [CLS] search_query: who [SEP]
    plain = tokenizer("who is it")["input_ids"]
    width = len(prefixed)
    assert len(plain) == width - 2
    example = {
        "input_ids": torch.tensor([prefixed, prefixed]),
        "attention_mask": torch.ones(2, width, dtype=torch.long),
    }
    export_graph(graph, {**example, "task_ids": torch.tensor([-1, 3])}, tmp_path / "onnx" / "model.onnx", None)
    ids = torch.tensor([prefixed, plain + [tokenizer.pad_token_id] * 2, prefixed])
    mask = (ids != tokenizer.pad_token_id).long()
    sentence, _, routed = run(tmp_path, {"input_ids": ids, "attention_mask": mask, "task_ids": [-1, -1, 2]})
    assert routed.tolist() == [0, -1, 2]  # the prefix, nothing (no default task), the id over the prefix
    assert np.isnan(sentence[1]).all() and np.isfinite(sentence[[0, 2]]).all()
    with torch.no_grad():
        expected = model(input_ids=ids[[0, 2]], attention_mask=mask[[0, 2]], task_ids=[0, 2]).last_hidden_state
    pooled = (expected * mask[[0, 2]].unsqueeze(-1)).sum(1) / mask[[0, 2]].sum(1, keepdim=True)
    assert np.abs(sentence[[0, 2]] - pooled.numpy()).max() <= 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("family", ["moe", "comoe"])
def test_moe_and_comoe_folders_embed_as_encode(family, moe_dir, comoe_dir, moe_onnx, comoe_onnx):
    folder, out = {"moe": (moe_dir, moe_onnx), "comoe": (comoe_dir, comoe_onnx)}[family]
    st = SentenceTransformer(folder, trust_remote_code=True)
    texts = [st.prompts["query"] + TEXTS[0], *TEXTS[1:], LONG]
    sentence = run(out, client_feed(out, texts))[0]
    assert np.abs(sentence - st.encode(texts)).max() <= 1e-4
    variants = read_json(out / "onnx_config.json")["int8"]["variants"]
    assert min(variant["min_cosine"] for variant in variants.values()) >= 0.9


def test_merged_comoe_exports_as_a_plain_dense_graph(comoe_dir, tmp_path, capsys):
    """CoMoE served at the dense model's speed: `merge` folds the LoRA experts in, `export` writes a plain graph
    (no router, no top-k) that embeds as the merged folder's `encode` and has every weight matmul in int8."""
    import onnx

    from moe_embed.convert.merge_experts import main as merge_main
    from moe_embed.convert.onnx_int8 import INT8_FILE

    trained, merged, out = tmp_path / "comoe-trained", tmp_path / "merged", tmp_path / "merged-onnx"
    save_trained_copy(comoe_dir, trained, seed=3)  # LoRA experts that matter (upcycled B is 0)
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(TEXTS) + "\n")
    code, err = run_main(
        merge_main, str(trained), "--output", str(merged), "--calibration", str(calibration), capsys=capsys
    )
    assert code == 0, err
    code, err = export(
        capsys, str(merged), "--output", str(out), "--quantize", "int8", "--int8-min-cosine", "0.9",
        "--int8-variants", "avx512_vnni,avx2",
    )  # fmt: skip
    assert code == 0, err
    info = read_json(out / "onnx_config.json")
    # the families asked for, and only they
    assert sorted(p.name for p in (out / "onnx").glob("model_*")) == [INT8_FILE, "model_quint8_avx2.onnx"]
    assert list(info["int8"]["variants"]) == ["avx512_vnni", "avx2"]
    assert info["source_model_type"] == "bert" and info["outputs"] == ["sentence_embedding", "last_hidden_state"]
    st = SentenceTransformer(str(merged))  # a dense folder: no remote code
    texts = [st.prompts["query"] + TEXTS[0], *TEXTS[1:], LONG]
    assert np.abs(run(out, client_feed(out, texts))[0] - st.encode(texts)).max() <= 1e-4
    ops = Counter(node.op_type for node in onnx.load(str(out / "onnx" / INT8_FILE)).graph.node)
    # no routing left, and the six linears of each layer in int8, as in the dense model
    layers = read_json(out / "config.json")["num_hidden_layers"]
    assert ops["TopK"] == 0 and ops["MatMulInteger"] == 6 * layers, ops
    assert not (trained / "onnx").exists() and not (merged / "onnx").exists()  # inputs untouched


@pytest.mark.parametrize(
    "case, message",
    [
        ("other-type", "holds model_type='gpt2'; expected a MoTE (mote_bert)"),
        ("task-on-moe", "--task applies to MoTE folders"),
        ("unknown-task", "Unknown task 'legal'"),
        ("opset", "--opset must lie in 18..23"),
        ("aea", "is an AEA folder"),
        ("exists", "already exists; pass --overwrite"),
        ("prompt-excluded", "pools without the prompt tokens"),
        ("task-ids-on-moe", "--task-ids-input applies to routed MoTE graphs"),
        pytest.param("int8-bound", "its cosine to fp32 falls to", marks=pytest.mark.slow),  # a whole export first
    ],
)
def test_bad_input_is_one_line_and_exit_2(case, message, mote_dir, moe_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = {
        "other-type": [str(tmp_path / "gpt2")],
        "task-on-moe": [moe_dir, "--task", "query"],
        "unknown-task": [mote_dir, "--task", "legal"],
        "opset": [mote_dir, "--opset", "9"],
        "aea": [str(tmp_path / "aea")],
        "exists": [mote_dir],
        "prompt-excluded": [str(tmp_path / "no-prompt")],
        "task-ids-on-moe": [moe_dir, "--task-ids-input"],
        "int8-bound": [mote_dir, "--quantize", "int8", "--int8-min-cosine", "1"],
    }[case]
    if case == "prompt-excluded":
        shutil.copytree(mote_dir, tmp_path / "no-prompt")
        pooling = tmp_path / "no-prompt" / "1_Pooling" / "config.json"
        pooling.write_text(json.dumps({**read_json(pooling), "include_prompt": False}))
    if case == "other-type":
        (tmp_path / "gpt2").mkdir()
        (tmp_path / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}')
    if case == "aea":
        (tmp_path / "aea").mkdir()
        (tmp_path / "aea" / "config.json").write_text("{}")
        (tmp_path / "aea" / "aea_config.json").write_text("{}")
    if case == "exists":
        out.mkdir()
        (out / "keep.txt").write_text("x")
    code, err = export(capsys, *args, "--output", str(out))
    assert code == 2 and message in err.strip().splitlines()[-1], err
    assert (out / "keep.txt").exists() if case == "exists" else not out.exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def empty_activation_ranges(xml: Path) -> list[str]:
    """The activation quantisers of an OpenVINO int8 model whose range is empty (every value quantised to zero)."""
    import openvino

    empty = []
    for op in openvino.Core().read_model(str(xml)).get_ops():
        if op.get_type_name() == "FakeQuantize" and op.input_value(0).get_node().get_type_name() != "Constant":
            low, high = (op.input_value(i).get_node().get_data() for i in (1, 2))
            if np.all(high <= low):
                empty.append(op.get_friendly_name())
    return empty


@pytest.mark.slow
def test_openvino_int8_of_a_token_moe_is_quiet_and_quantises_no_input_to_zero(dense_path, tmp_path_factory, caplog):
    """A token MoE whose router reaches its experts unevenly (upcycled with expert noise): an expert that gets no
    calibration token in a batch spoils NNCF's range of its input, which comes out empty ([0, 0]: every value
    quantised to zero), with 20-odd numpy/NNCF RuntimeWarnings on the way. The export emits no RuntimeWarning
    and no activation of its int8 model has an empty range; calibrated on plain texts only (no prompts), where
    one expert gets no token at all, the inputs that could not be measured stay float32, said in one log line."""
    import logging
    import warnings

    from tokenizers import Tokenizer

    from moe_embed.convert.openvino_int8 import OPENVINO_INT8_FILE, quantize_openvino

    source = upcycled(tmp_path_factory, dense_path, "moe-noisy", arch="moe", expert_noise=0.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        folder = export_onnx_folder(tmp_path_factory, source, quantize="int8", int8_min_cosine=0.9)
        assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
        assert empty_activation_ranges(folder / OPENVINO_INT8_FILE) == []

        plain = folder / "plain.xml"
        client = Tokenizer.from_file(str(folder / "tokenizer.json"))
        with caplog.at_level(logging.INFO, logger="moe_embed.convert.openvino_int8"):
            quantize_openvino(folder / "onnx" / "model.onnx", plain, client, prompts={})
    assert [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)] == []
    assert empty_activation_ranges(plain) == []
    lines = [r.getMessage() for r in caplog.records if "stay in float32" in r.getMessage()]
    assert len(lines) == 1 and int(lines[0].split("OpenVINO int8: ")[1].split()[0]) >= 1, lines


def test_an_activation_quantiser_with_an_empty_range_is_bypassed():
    """`keep_unmeasured_inputs_in_fp32`: a FakeQuantize of range [0, 0] in front of a matmul (NNCF's range of an
    input it saw no data for) is taken out, so the input reaches the matmul as it is; one with a range stays."""
    import openvino
    from openvino import opset13 as ops

    from moe_embed.convert.openvino_int8 import keep_unmeasured_inputs_in_fp32

    def quantiser(node, low, high):
        low, high = ops.constant(np.float32(low)), ops.constant(np.float32(high))
        return ops.fake_quantize(node, low, high, low, high, 256)

    x = ops.parameter([2, 4], np.float32, name="x")
    weight = ops.constant(np.arange(16, dtype=np.float32).reshape(4, 4) / 10)
    empty = ops.matmul(quantiser(x, 0.0, 0.0), weight, False, False)
    measured = ops.matmul(quantiser(x, -2.0, 2.0), weight, False, False)
    model = openvino.Model([empty, measured], [x])
    assert keep_unmeasured_inputs_in_fp32(model) == 1
    feed = np.linspace(-1.5, 1.5, 8, dtype=np.float32).reshape(2, 4)
    results = openvino.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([feed])
    got_empty, got_measured = results[0], results[1]
    assert np.allclose(got_empty, feed @ weight.get_data(), atol=1e-5)  # before: all zeros
    assert np.abs(got_measured - feed @ weight.get_data()).max() < 0.1  # still quantised, close
    assert sum(op.get_type_name() == "FakeQuantize" for op in model.get_ops()) == 1
