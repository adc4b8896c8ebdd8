"""int8 that keeps its bound where activations have outliers (`convert/onnx_smoothing.py`, `onnx_int8.Int8Fit`):
smoothing computes what the graph computed and takes the outliers out of the activations' int8 scale; the export
fits a graph whose plain int8 misses the bound (as all-mpnet-base-v2's does) and leaves BERT's as it was."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from moe_embed.convert.onnx_int8 import quantize, row_cosines
from moe_embed.convert.onnx_smoothing import smooth


def two_matmuls(tmp_path: Path) -> Path:
    """`relu(x @ W1) @ W2` with x `(batch, tokens, 8)`; its feeds carry a channel of x a hundred times the others,
    whose weights are a hundred times smaller."""
    rng = np.random.default_rng(0)
    up = rng.normal(size=(8, 16)).astype(np.float32)
    up[0] /= 100.0  # the large channel weighs as much as the others in the product: the others' precision matters
    w1 = numpy_helper.from_array(up, "w1")
    w2 = numpy_helper.from_array(rng.normal(size=(16, 4)).astype(np.float32), "w2")
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="up"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "w2"], ["y"], name="down"),
    ]
    graph = helper.make_graph(
        nodes,
        "two_matmuls",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "tokens", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "tokens", 4])],
        [w1, w2],
    )
    path = tmp_path / "fp32.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def outlier_feeds(count: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        x = rng.normal(size=(2, 5, 8)).astype(np.float32)
        x[..., 0] *= 100.0  # one channel far larger than the rest, as MPNet's feed-forward activations have
        feeds.append({"x": x})
    return feeds


def outputs(graph, feeds: list[dict]) -> np.ndarray:
    """The graph's output rows for `feeds` (`graph`: a file, or a `ModelProto`)."""
    import onnxruntime

    source = str(graph) if isinstance(graph, Path) else graph.SerializeToString()
    session = onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, feed)[0].reshape(-1, 4) for feed in feeds])


def test_smoothing_computes_what_the_graph_computed_and_evens_the_int8_inputs(tmp_path):
    fp32 = two_matmuls(tmp_path)
    model = onnx.load(str(fp32))
    order = smooth(model, outlier_feeds(4, seed=1), tmp_path, skip=".router.")
    assert list(order) == ["x", "a"]  # the input with the outlier channel is the one int8 keeps worst
    assert order["x"] == ["up"] and order["a"] == ["down"]
    held_out = outlier_feeds(4, seed=2)
    reference = outputs(fp32, held_out)
    np.testing.assert_allclose(outputs(model, held_out), reference, rtol=1e-4, atol=1e-3)
    smoothed = tmp_path / "smoothed.onnx"
    onnx.save(model, str(smoothed))
    quantize(fp32, tmp_path / "plain-int8.onnx")
    quantize(smoothed, tmp_path / "smoothed-int8.onnx")

    def error(path):
        got = outputs(path, held_out)
        return float(np.linalg.norm(got - reference) / np.linalg.norm(reference))

    assert error(tmp_path / "smoothed-int8.onnx") * 3 < error(tmp_path / "plain-int8.onnx")


@pytest.mark.slow
def test_an_export_whose_plain_int8_misses_the_bound_is_fitted_to_it(tmp_path):
    """A tiny MPNet given outlier channels in its feed-forward activations (its up projections' rows for two
    channels scaled up a thousandfold): plain int8 misses the export's bound (cosine 0.84), the fitted graph keeps
    it and says how it was made."""
    import shutil

    from conftest import TINY_BASES
    from safetensors.torch import load_file, save_file
    from tokenizers import Tokenizer

    from moe_embed.convert.export_onnx import ExportOptions, export_onnx
    from moe_embed.convert.onnx_graph import embed, session
    from moe_embed.convert.onnx_int8 import agreement_texts

    source = tmp_path / "outliers"
    shutil.copytree(TINY_BASES["mpnet"], source)
    state = load_file(str(source / "model.safetensors"))
    for layer in range(4):
        for name in ("weight", "bias"):
            tensor = state[f"encoder.layer.{layer}.intermediate.dense.{name}"]
            tensor[:2] *= 1000.0  # two channels' pre-activations, and so their GELU outputs, a thousand times larger
    save_file({k: v.contiguous() for k, v in state.items()}, str(source / "model.safetensors"))
    folder = export_onnx(ExportOptions(model_dir=str(source), output=tmp_path / "onnx", quantize="int8"))
    variants = json.loads((folder / "onnx_config.json").read_text())["int8"]["variants"]
    fitted = variants["avx512_vnni"]
    assert fitted["smoothquant"] is True and fitted["min_cosine"] >= 0.97
    client = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = agreement_texts({})
    reference = embed(session(folder / "onnx" / "model.onnx"), client, texts)
    quantize(folder / "onnx" / "model.onnx", tmp_path / "plain.onnx")
    assert row_cosines(embed(session(tmp_path / "plain.onnx"), client, texts), reference).min() < 0.97
