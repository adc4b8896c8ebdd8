"""Activation outliers moved into the weights before dynamic int8: SmoothQuant (Xiao et al., 2023, "SmoothQuant:
Accurate and Efficient Post-Training Quantization for Large Language Models"), for the onnxruntime int8 graphs.

onnxruntime's dynamic quantisation gives each matmul's activations one scale per tensor, chosen per call. A few
channels with values far larger than the rest (MPNet's feed-forward activations have them) take the whole int8
range, and the other channels round to a handful of steps: the dense all-mpnet-base-v2's int8 graph fell to cosine
0.81 against its fp32 graph, 0.97 with every feed-forward output projection left in fp32. SmoothQuant divides each
input channel `j` by `s_j = max|x_j|^α / max|W_j|^(1-α)` and multiplies the weight's row `j` by it: the product is
unchanged, the activations' channels are evened out and the weights, quantised per output channel, take the
difference. Here the division is one `Mul` per distinct matmul input (a LayerNorm's output feeds the query, key and
value projections: one `Mul`, `s` from their weights together), inserted in front of the matmuls, since in a
post-LN layer the input also feeds the residual and in a feed-forward block it comes out of GELU: neither can
absorb `1/s`. `max|x_j|` is measured on the calibration texts OpenVINO's int8 uses, behind every prompt
(`openvino_int8.calibration_feeds`); a channel no calibration row reached keeps `s = 1`. Routers are left alone: they
stay fp32 (`onnx_int8.router_nodes`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

# the migration strength: measured on all-mpnet-base-v2 (min cosine to fp32 0.985 at 0.7, 0.988 at 0.85; the
# paper's 0.5 leaves too much in the activations here); 0.85 is kept for every base
ALPHA = 0.85
# `s` stays within these bounds, so that no channel's weights or activations are scaled out of float32's comfort
S_RANGE = (1e-4, 1e4)


def weight_matmuls(model, skip: str) -> dict[str, list]:
    """The matmuls by a 2-D weight initializer whose name does not hold `skip` (the routers'), grouped by their
    activation input."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    groups: dict[str, list] = {}
    for node in model.graph.node:
        if node.op_type != "MatMul" or len(node.input) != 2 or node.input[1] not in initializers:
            continue
        if skip in node.input[1] or len(initializers[node.input[1]].dims) != 2:
            continue
        groups.setdefault(node.input[0], []).append(node)
    return groups


def probe(model, inputs: list[str], scratch: Path):
    """An onnxruntime session of `model` whose outputs are the tensors `inputs`; the probing graph is written to
    `scratch` (a graph over protobuf's 2 GiB needs its weights in a file beside it)."""
    import copy

    import onnx
    import onnxruntime

    probing = copy.deepcopy(model)
    del probing.graph.output[:]
    outputs = (onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None) for name in inputs)
    probing.graph.output.extend(outputs)
    path = Path(scratch) / "probe.onnx"
    onnx.save_model(probing, str(path), save_as_external_data=True, location="probe.onnx.data")
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def probed(session, inputs: list[str], feeds: list[dict]):
    """`(feed, input name, its rows (tokens, channels))` for every feed, skipping empty tensors (an expert no token
    of a batch reached)."""
    for index, feed in enumerate(feeds):
        for name, value in zip(inputs, session.run(inputs, feed), strict=True):
            if value.size:
                yield index, name, value.reshape(-1, value.shape[-1])


def channel_maxima(session, inputs: list[str], feeds: list[dict]) -> dict[str, np.ndarray | None]:
    """`max |x_j|` over the calibration feeds of each tensor of `inputs`, per channel (its last dimension)."""
    maxima = {name: None for name in inputs}
    for _, name, rows in probed(session, inputs, feeds):
        batch_max = np.abs(rows).max(0)
        maxima[name] = batch_max if maxima[name] is None else np.maximum(maxima[name], batch_max)
    return maxima


def quantisation_errors(session, inputs: list[str], feeds: list[dict], scales: dict) -> dict[str, float]:
    """For each input, the worst relative error over the feeds of quantising its smoothed rows (`x / s`) to uint8
    with one scale and zero point per tensor, as onnxruntime's dynamic quantisation does per call: how much of the
    int8 graph's error that matmul's activations bring."""
    errors = dict.fromkeys(inputs, 0.0)
    for _, name, rows in probed(session, inputs, feeds):
        x = rows / scales[name]
        low, high = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
        step = (high - low) / 255 or 1.0
        restored = np.round((x - low) / step) * step + low
        error = float(np.linalg.norm(restored - x) / max(float(np.linalg.norm(x)), 1e-12))
        errors[name] = max(errors[name], error)
    return errors


def smooth(model, feeds: list[dict], scratch: Path, skip: str, alpha: float = ALPHA) -> dict[str, list[str]]:
    """Rewrite `model` (an fp32 `ModelProto`, in place) so that its weight matmuls (but those whose weight's name
    holds `skip`) read smoothed activations (see the module docstring). The graph computes what it computed, up to
    rounding. Returns the names of the matmuls of each smoothed input, those whose smoothed activations int8 keeps
    worst first (`quantisation_errors`): where int8 must leave some in fp32, those go first."""
    import onnx
    from onnx import numpy_helper

    groups = weight_matmuls(model, skip)
    inputs = list(groups)
    session = probe(model, inputs, scratch)
    maxima = channel_maxima(session, inputs, feeds)
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    scales = {}
    for name, matmuls in groups.items():
        weights = {node.input[1]: numpy_helper.to_array(initializers[node.input[1]]) for node in matmuls}
        if maxima[name] is None:
            continue
        weight_max = np.max([np.abs(w).max(1) for w in weights.values()], axis=0)  # (in,): row j of each (in, out)
        scale = maxima[name] ** alpha / np.maximum(weight_max, 1e-12) ** (1 - alpha)
        scales[name] = np.where(maxima[name] > 0, np.clip(scale, *S_RANGE), 1.0).astype(np.float32)
        for weight_name, weight in weights.items():
            initializers[weight_name].CopyFrom(numpy_helper.from_array(weight * scales[name][:, None], weight_name))
    errors = quantisation_errors(session, list(scales), feeds, scales)
    for index, name in enumerate(scales):
        inverse = numpy_helper.from_array((1.0 / scales[name]).astype(np.float32), f"smoothquant.{index}.inverse")
        model.graph.initializer.append(inverse)
        smoothed = f"smoothquant.{index}.input"
        nodes = list(model.graph.node)
        first = min(nodes.index(node) for node in groups[name])
        mul = onnx.helper.make_node("Mul", [name, inverse.name], [smoothed], name=f"smoothquant.{index}.mul")
        model.graph.node.insert(first, mul)
        for node in groups[name]:
            node.input[0] = smoothed
    worst = sorted(scales, key=lambda name: -errors[name])
    return {name: [node.name for node in groups[name]] for name in worst}


__all__ = ["ALPHA", "smooth", "weight_matmuls", "probe", "channel_maxima", "quantisation_errors"]
