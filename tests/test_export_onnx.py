"""convert/export_onnx.py: graphs that route like the PyTorch model on batches unlike their example input."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch
from conftest import TEXTS, read_json, run_isolated, run_main, save_trained_copy, tiny_family_model, tiny_mote_config
from sentence_transformers import SentenceTransformer
from sentence_transformers.models import Pooling

from convert.export_onnx import SentenceEmbeddingGraph, export_graph
from convert.export_onnx import main as export_main


def export(capsys, *args) -> tuple[int, str]:
    return run_main(export_main, *args, capsys=capsys)


def run(folder: Path, feeds: dict) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {name: np.asarray(value, dtype=np.int64) for name, value in feeds.items()})


def tokens(tokenizer, texts):
    batch = tokenizer(texts, padding=True, return_tensors="np")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


@pytest.fixture(scope="module")
def trained_mote(mote_dir, tmp_path_factory):
    """A MoTE folder whose experts differ, so that a graph frozen to one expert would be caught."""
    folder = tmp_path_factory.mktemp("onnx") / "trained-mote"
    save_trained_copy(mote_dir, folder, seed=5)
    return folder


@pytest.fixture(scope="module")
def mote_graph(trained_mote, tmp_path_factory):
    out = tmp_path_factory.mktemp("onnx") / "mote-onnx"
    assert export_main([str(trained_mote), "--output", str(out)]) == out
    return out


def test_routed_mote_graph_matches_sentence_transformers(trained_mote, mote_graph, tokenizer):
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    assert [i.name for i in onnxruntime.InferenceSession(str(mote_graph / "model.onnx")).get_inputs()] == [
        "input_ids",
        "attention_mask",
        "task_ids",
    ]
    # four tasks mixed in one padded batch of another size and length than the example, routed by prefix
    tasks = ["clustering", "query", "document", "classification", "query"]
    texts = [st.prompts[t] + text for t, text in zip(tasks, TEXTS + TEXTS[:2], strict=True)]
    feeds = {**tokens(tokenizer, texts), "task_ids": [-1] * len(texts)}
    token_embeddings, sentence, routed = run(mote_graph, feeds)
    assert routed.tolist() == [st[0].auto_model.config.tasks.index(t) for t in tasks]
    expected = st.encode(texts, convert_to_tensor=True)  # pre-prefixed texts are routed by their prefix
    assert np.abs(sentence - expected.numpy()).max() <= 1e-4
    # task_ids beat the prefix, and a text without a prefix goes to the default task (classification)
    feeds = {**tokens(tokenizer, [texts[0], TEXTS[1]]), "task_ids": [1, -1]}
    _, sentence, routed = run(mote_graph, feeds)
    assert routed.tolist() == [1, 2]
    model = st[0].auto_model
    with torch.no_grad():
        reference = model(**tokenizer([texts[0], TEXTS[1]], padding=True, return_tensors="pt"), task_ids=[1, 2])
    mask = torch.tensor(feeds["attention_mask"]).unsqueeze(-1)
    pooled = torch.nn.functional.normalize((reference.last_hidden_state * mask).sum(1) / mask.sum(1), dim=1)
    assert np.abs(sentence - pooled.numpy()).max() <= 1e-4
    # a frozen graph would give every row the example's expert: the experts really differ here
    other = st.encode([texts[0]], task="query", prompt=st.prompts["clustering"], convert_to_tensor=True)
    assert (other[0] - expected[0]).abs().max() > 1e-3


def test_task_export_is_a_plain_graph(trained_mote, tmp_path, tokenizer, capsys):
    out = tmp_path / "query-onnx"
    code, err = export(capsys, str(trained_mote), "--task", "passage", "--output", str(out))
    assert code == 0, err
    config = read_json(out / "onnx_config.json")
    assert config["inputs"] == ["input_ids", "attention_mask"] and config["exported_task"] == "document"
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    _, sentence = run(out, tokens(tokenizer, ["search_document: " + t for t in TEXTS]))
    expected = st.encode_document(TEXTS, convert_to_tensor=True)
    assert np.abs(sentence - expected.numpy()).max() <= 1e-4


def test_onnx_folder_embeds_without_torch(mote_graph):
    """The README's snippet, run where torch cannot be imported, gives the graph's embeddings."""
    readme = (mote_graph / "README.md").read_text()
    snippet = readme.split("```python\n")[1].split("```")[0]
    code = "import sys, os, json\nsys.modules['torch'] = None\nos.chdir(sys.argv[1])\n"
    code += snippet + "print(json.dumps(embeddings.tolist()))\n"
    got = np.array(json.loads(run_isolated(code, str(mote_graph)).splitlines()[-1]))
    assert got.shape == (1, 384) and np.isfinite(got).all()
    assert abs(np.linalg.norm(got) - 1.0) < 1e-4  # normalised in the graph, as the folder's Normalize module does


@pytest.mark.parametrize("implementation", ["eager", "grouped_mm", "batched_mm"])
def test_moe_graph_keeps_padding_and_routing(implementation, tmp_path):
    """Traced on an unpadded batch, the graph still masks padding and routes every token of other batches."""
    model = tiny_family_model("moe_bert", experts_implementation=implementation).eval()
    graph = SentenceEmbeddingGraph(model, [Pooling(model.config.hidden_size)])
    export_graph(
        graph, (torch.randint(5, 120, (2, 7)), torch.ones(2, 7, dtype=torch.long)), tmp_path / "model.onnx", None
    )
    ids = torch.randint(5, 120, (3, 11))
    mask = torch.tensor([[1] * 11, [1] * 4 + [0] * 7, [1] * 9 + [0] * 2])
    got = run(tmp_path, {"input_ids": ids, "attention_mask": mask})
    with torch.no_grad():
        expected = graph(ids, mask)
    real = mask.bool().numpy()
    assert np.abs(got[0][real] - expected[0].numpy()[real]).max() <= 1e-4
    assert np.abs(got[1] - expected[1].numpy()).max() <= 1e-4


def test_strict_mote_graph_marks_unrouted_rows_nan(tmp_path):
    from modeling.modeling_mote import MoteBertModel

    model = MoteBertModel(tiny_mote_config()).eval()  # no default task
    graph = SentenceEmbeddingGraph(model, [Pooling(model.config.hidden_size)])
    prefixed = [101, 3945, 1035, 23032, 1024, 2040, 102]  # [CLS] search_query: who [SEP]
    example = (torch.tensor([prefixed, prefixed]), torch.ones(2, 7, dtype=torch.long), torch.tensor([-1, 3]))
    export_graph(graph, example, tmp_path / "model.onnx", None)
    ids = torch.tensor([prefixed, [101, 2040, 2003, 2009, 102, 0, 0], prefixed])
    mask = (ids != 0).long()
    _, sentence, routed = run(tmp_path, {"input_ids": ids, "attention_mask": mask, "task_ids": [-1, -1, 2]})
    assert routed.tolist() == [0, -1, 2]
    assert np.isnan(sentence[1]).all() and np.isfinite(sentence[[0, 2]]).all()
    with torch.no_grad():
        expected = model(input_ids=ids[[0, 2]], attention_mask=mask[[0, 2]], task_ids=[0, 2]).last_hidden_state
    pooled = (expected * mask[[0, 2]].unsqueeze(-1)).sum(1) / mask[[0, 2]].sum(1, keepdim=True)
    assert np.abs(sentence[[0, 2]] - pooled.numpy()).max() <= 1e-4


@pytest.mark.slow
def test_moe_and_comoe_folders_export(moe_dir, comoe_dir, tmp_path, tokenizer, capsys):
    for folder in (moe_dir, comoe_dir):
        out = tmp_path / Path(folder).name
        code, err = export(capsys, folder, "--output", str(out), "--opset", "18")
        assert code == 0, err
        st = SentenceTransformer(folder, trust_remote_code=True)
        _, sentence = run(out, tokens(tokenizer, TEXTS))
        assert np.abs(sentence - st.encode(TEXTS)).max() <= 1e-4


@pytest.mark.parametrize(
    "case, message",
    [
        ("dense", "holds model_type='bert'; expected a MoTE (mote_bert)"),
        ("task-on-moe", "--task applies to MoTE folders"),
        ("unknown-task", "Unknown task 'legal'"),
        ("opset", "--opset must lie in 18..23"),
        ("aea", "is an AEA folder"),
        ("exists", "already exists; pass --overwrite"),
        ("prompt-excluded", "pools without the prompt tokens"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(case, message, mote_dir, moe_dir, dense_path, tmp_path, capsys):
    out = tmp_path / "out"
    args = {
        "dense": [dense_path],
        "task-on-moe": [moe_dir, "--task", "query"],
        "unknown-task": [mote_dir, "--task", "legal"],
        "opset": [mote_dir, "--opset", "9"],
        "aea": [str(tmp_path / "aea")],
        "exists": [mote_dir],
        "prompt-excluded": [str(tmp_path / "no-prompt")],
    }[case]
    if case == "prompt-excluded":
        shutil.copytree(mote_dir, tmp_path / "no-prompt")
        pooling = tmp_path / "no-prompt" / "1_Pooling" / "config.json"
        pooling.write_text(json.dumps({**read_json(pooling), "include_prompt": False}))
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
