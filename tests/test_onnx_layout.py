"""convert/onnx_layout.py: every family's exported graph is in the shape onnxruntime runs on its fastest
kernels (eager attention, no SkipLayerNormalization), every weight MatMul of the int8 graph is quantised, and
the rewrite keeps the graph's function."""

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from conftest import TEXTS, client_feed, read_json

from moe_embed.convert.onnx_layout import eager_attention, flatten_layer_norms, transposed_operands_in_matmul


def optimized(path: Path, tmp_path: Path) -> onnx.ModelProto:
    """`path` after onnxruntime's default (all) graph optimisations, as a client's session runs it."""
    options = onnxruntime.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / f"{path.stem}.optimized.onnx")
    onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


def optimized_ops(path: Path, tmp_path: Path) -> Counter:
    """The op types of `path` after onnxruntime's graph optimisations."""
    return Counter(node.op_type for node in optimized(path, tmp_path).graph.node)


def innermost_axis_moves(model: onnx.ModelProto) -> list[list[int]]:
    """The perms of `model`'s 4-D transposes (attention's heads) that move the innermost axis: a strided copy of
    every element. (The token MoE's routing transposes small 2-D index tables.)"""
    perms = [
        next(list(a.ints) for a in n.attribute if a.name == "perm")
        for n in model.graph.node
        if n.op_type == "Transpose"
    ]
    return [perm for perm in perms if len(perm) == 4 and perm[-1] != len(perm) - 1]


def weight_matmuls(path: Path) -> int:
    """MatMuls whose second input is a weight (an initializer) other than a router's (routers stay fp32)."""
    model = onnx.load(str(path))
    weights = {t.name for t in model.graph.initializer if ".router." not in t.name}
    return sum(n.op_type == "MatMul" and n.input[1] in weights for n in model.graph.node)


@pytest.mark.parametrize("family", ["mote", "moe", "comoe"])
def test_exported_graphs_avoid_the_slow_kernels(family, mote_onnx, moe_onnx, comoe_onnx, tmp_path):
    folder = {"mote": mote_onnx, "moe": moe_onnx, "comoe": comoe_onnx}[family]
    config = read_json(folder / "config.json")
    layers = config["num_hidden_layers"]
    expert_layers = len(config.get("expert_layers") or config.get("moe_layers") or [])
    for file in ("onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"):
        ops = optimized_ops(folder / file, tmp_path)
        assert ops["SkipLayerNormalization"] == 0, (file, ops)
        assert ops["IsNaN"] == 0, (file, ops)  # sdpa's guard for fully masked rows: eager attention has none
        assert ops["LayerNormalization"] >= 1 + 2 * layers, (file, ops)  # the embeddings' and two per layer
    # attention's keys, (batch, seq, heads, dim) to (batch, heads, dim, seq), are read transposed by the int8
    # graph's FusedMatMul (`transposed_operands_in_matmul`): no transpose of every element moves the innermost axis
    assert innermost_axis_moves(optimized(folder / "onnx/model_qint8_avx512_vnni.onnx", tmp_path)) == []
    # standard ONNX: one a layer
    assert len(innermost_axis_moves(optimized(folder / "onnx/model.onnx", tmp_path))) == layers
    fp32 = weight_matmuls(folder / "onnx/model.onnx")
    # six per layer (query, key, value, attention output, the feed-forward pair), and in each expert layer one
    # feed-forward pair per further expert (MoTE: 4 tasks, MoE: 8 experts)
    experts = {"mote": len(config.get("tasks") or []), "moe": config.get("num_local_experts")}
    expected = {family: 6 * layers + expert_layers * (count - 1) * 2 for family, count in experts.items() if count}
    # CoMoE: each of its linears (four a layer: query, key, value, attention output) adds the A and the B product
    # of its LoRA experts
    expected = {**expected, "comoe": 6 * layers + 4 * layers * 2}
    assert fp32 == expected[family]
    int8 = onnx.load(str(folder / "onnx/model_qint8_avx512_vnni.onnx"))
    assert Counter(n.op_type for n in int8.graph.node)["MatMulInteger"] == fp32  # every weight MatMul in int8
    weights = {t.name for t in int8.graph.initializer}
    routers = {"mote": 0, "moe": expert_layers, "comoe": 4 * layers}[family]  # fp32: one per MoE layer or linear
    assert sum(n.op_type in ("MatMul", "Gemm") and n.input[1] in weights for n in int8.graph.node) == routers


def test_routed_mote_graph_splits_each_expert_layer_once(mote_onnx, tmp_path):
    """MoTE's experts read their runs of the sorted batch from one `Split` per expert layer: no per-expert
    `NonZero` + `Gather`; the experts' LayerNorms are flattened by the layout pass as every other one is (the
    model itself does no shaping for a runtime); the prompts are read once."""
    expert_layers = read_json(mote_onnx / "config.json")["expert_layers"]
    for file in ("onnx/model.onnx", "onnx/model_qint8_avx512_vnni.onnx"):
        ops = optimized_ops(mote_onnx / file, tmp_path)
        assert ops["NonZero"] == 0, (file, ops)
        assert ops["Split"] >= len(expert_layers), (file, ops)  # one per expert layer (and any onnxruntime fuses)
        # the prompts are read once, every prefix at once (`TaskRouter.match`)
        assert ops["ArgMax"] == 1, (file, ops)
    model = onnx.load(str(mote_onnx / "onnx/model.onnx"))
    produced_by = {output: node for node in model.graph.node for output in node.output}
    expert_norms = [n for n in model.graph.node if n.op_type == "LayerNormalization" and ".experts." in n.input[1]]
    assert len(expert_norms) == len(expert_layers) * 4 * 2  # four tasks, two norms per expert
    assert all(produced_by[n.input[0]].op_type == "Reshape" for n in expert_norms)  # `flatten_layer_norms`


def test_flattened_layer_norms_compute_the_same(tmp_path):
    """The rewrite on a residual + LayerNorm graph: same outputs for several shapes, and onnxruntime no longer
    fuses it into SkipLayerNormalization."""
    from onnx import TensorProto, helper, numpy_helper

    hidden = 8
    rng = np.random.default_rng(0)
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", hidden]) for n in ("x", "skip")]
    scale, bias = (numpy_helper.from_array(rng.normal(size=hidden).astype(np.float32), n) for n in ("g", "b"))
    nodes = [
        helper.make_node("Add", ["x", "skip"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "g", "b"], ["y"], axis=-1, epsilon=1e-5),
    ]
    graph = helper.make_graph(
        nodes, "ln", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden])]
    )
    graph.initializer.extend([scale, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    original = tmp_path / "original.onnx"
    onnx.save(model, str(original))
    assert flatten_layer_norms(model) == 1
    onnx.checker.check_model(model)
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, str(rewritten))
    assert optimized_ops(original, tmp_path)["SkipLayerNormalization"] == 1  # what the rewrite avoids
    assert optimized_ops(rewritten, tmp_path)["SkipLayerNormalization"] == 0
    for shape in [(1, 1, hidden), (3, 5, hidden)]:
        feed = {"x": rng.normal(size=shape).astype(np.float32), "skip": rng.normal(size=shape).astype(np.float32)}
        expected, got = (
            onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feed)[0]
            for p in (original, rewritten)
        )
        assert got.shape == shape
        np.testing.assert_allclose(got, expected, atol=1e-5)


def test_flattening_leaves_a_layer_norm_of_rows_alone():
    """A LayerNorm whose input the exporter recorded as (tokens, hidden) is already flat: no Reshape around it."""
    from onnx import TensorProto, helper, numpy_helper

    hidden = 4
    scale, bias = (numpy_helper.from_array(np.ones(hidden, np.float32), n) for n in ("g", "b"))
    nodes = [
        helper.make_node("Identity", ["x"], ["rows"]),
        helper.make_node("LayerNormalization", ["rows", "g", "b"], ["y"], axis=-1),
    ]
    info = [helper.make_tensor_value_info("rows", TensorProto.FLOAT, ["tokens", hidden])]
    graph = helper.make_graph(
        nodes,
        "ln",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["tokens", hidden])],
        [scale, bias],
        value_info=info,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert flatten_layer_norms(model) == 0
    assert [n.op_type for n in model.graph.node] == ["Identity", "LayerNormalization"]
    del model.graph.value_info[:]  # rank unknown: flattened, as before
    assert flatten_layer_norms(model) == 1


def test_eager_attention_is_restored_after_the_trace(mote_dir):
    from transformers import AutoModel

    model = AutoModel.from_pretrained(mote_dir, trust_remote_code=True)
    before = model.config._attn_implementation
    assert before == "sdpa"
    with eager_attention(model):
        assert model.config._attn_implementation == "eager"
    assert model.config._attn_implementation == before


def test_routed_graph_embeds_texts_of_several_lengths_as_fp32(mote_onnx):
    """The rewritten graph on a padded batch: the same embeddings as row by row (padding does not leak)."""
    session = onnxruntime.InferenceSession(str(mote_onnx / "onnx/model.onnx"), providers=["CPUExecutionProvider"])
    texts = TEXTS[:4]
    batch = session.run(["sentence_embedding"], client_feed(mote_onnx, texts))[0]
    rows = np.concatenate([session.run(["sentence_embedding"], client_feed(mote_onnx, [t]))[0] for t in texts])
    np.testing.assert_allclose(batch, rows, atol=1e-5)


def test_transposed_operands_are_read_by_the_matmul(tmp_path):
    """Attention's scores as the exporter writes them (keys transposed to (batch, heads, dim, seq), innermost axis
    moved) and a plain swap of the last two axes: rewritten, same outputs, no innermost move left after
    onnxruntime's optimisations; a transpose that something else reads too is left as it is."""
    from onnx import TensorProto, helper

    rng = np.random.default_rng(0)
    batch, seq, heads, dim = 3, 5, 2, 4
    keys = [batch, seq, heads, dim]
    names = {"q": [batch, heads, seq, dim], "k": keys, "m": [batch, heads, seq, dim], "v": keys}
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in names.items()]
    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], name="keys", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Transpose", ["m"], ["mt"], name="swap", perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "mt"], ["other"]),
        helper.make_node("Transpose", ["v"], ["kt2"], name="shared", perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["q", "kt2"], ["third"]),
        helper.make_node("Identity", ["kt2"], ["kept"]),
    ]
    scores = [batch, heads, seq, seq]
    shapes = {"scores": scores, "other": scores, "third": scores, "kept": [batch, heads, dim, seq]}
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n, shape in shapes.items()]
    model = helper.make_model(
        helper.make_graph(nodes, "scores", inputs, outputs), opset_imports=[helper.make_opsetid("", 17)]
    )
    original = tmp_path / "original.onnx"
    onnx.save(model, str(original))
    assert transposed_operands_in_matmul(model) == 2
    onnx.checker.check_model(model)
    assert [n.op_type for n in model.graph.node].count("FusedMatMul") == 2
    assert [n.name for n in model.graph.node if n.op_type == "Transpose"] == ["keys_rows", "shared"]
    rewritten = tmp_path / "rewritten.onnx"
    onnx.save(model, str(rewritten))
    assert innermost_axis_moves(optimized(original, tmp_path)) == [[0, 2, 3, 1]] * 2
    assert innermost_axis_moves(optimized(rewritten, tmp_path)) == [[0, 2, 3, 1]]  # the one `Identity` reads too
    feed = {n: rng.normal(size=shape).astype(np.float32) for n, shape in names.items()}
    expected, got = (
        onnxruntime.InferenceSession(str(p), providers=["CPUExecutionProvider"]).run(None, feed)
        for p in (original, rewritten)
    )
    for a, b in zip(expected, got, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5)
