"""The shape of the exported graph, chosen so that runtimes run it on their fastest kernels, int8 included.

Measured on the dense all-MiniLM-L6-v2 (`docs/benchmarks.md`, "Why the int8 graph was slow"), parts of the
graph the dynamo exporter writes cost onnxruntime 20-45% in int8, and none is a matter of the CPU:

- **Attention.** `scaled_dot_product_attention` is written as ONNX ops with a guard for rows whose every key is
  masked (`IsNaN` and `Where` over the `(batch, heads, seq, seq)` probabilities) and the scale applied to both
  the queries and the transposed keys, which is then materialised. The model's own eager attention
  (`matmul(q, kᵀ) · scale + additive mask`, softmax, `matmul(·, v)`) needs none of that: onnxruntime folds the
  scale into one `FusedMatMul`, and an encoder row always keeps its `[CLS]` token, so no row
  is fully masked. `eager_attention` switches the model to it for the trace only.
- **The keys' transpose.** The exporter writes `(batch, seq, heads, dim)` to `(batch, heads, dim, seq)` as one
  `Transpose` that moves the innermost axis, a strided copy of every key that onnxruntime cannot fold into the
  matmul. `transposed_operands_in_matmul` (int8 file only: it writes onnxruntime's `FusedMatMul`) keeps the
  innermost axis in place and lets the matmul read the keys transposed.
- **Residual + LayerNorm.** onnxruntime fuses every `Add` of two rank-3 tensors followed by
  `LayerNormalization` into its `SkipLayerNormalization` kernel, which runs 4-6x slower than the `Add` and
  `LayerNormalization` it replaces on this CPU (onnxruntime 1.32; `benchmarks/ort_kernels.py`). The fusion
  only matches rank-3 inputs, so `flatten_layer_norms` runs each `LayerNormalization` on the rows flattened to
  `(tokens, hidden)`: a `Reshape` before and after it, which costs no copy. The graph stays standard ONNX, so
  OpenVINO and any other runtime read it as before.
- **Stacked expert weights.** The token-routed MoE keeps its experts stacked (`up_proj` `(E, inter, hidden)`),
  so each expert's matmul reads `Gather(up_proj, e)` and, on the rows routed to it, is written as `Gemm`:
  onnxruntime's dynamic quantiser touches neither (it quantises `MatMul`s whose weight is an initializer), and
  the int8 graph ran every expert in fp32 (CoMoE's LoRA experts likewise read reshaped, transposed stacks).
  `fold_weight_views` gives each such view of a weight an initializer of its own (the stacked one is
  dropped) and `gemm_as_matmul` writes `Gemm` as `MatMul` (+ `Add` of the bias), the form the quantiser and
  onnxruntime's int8 fusions know.
"""

from __future__ import annotations

import contextlib

import numpy as np
import onnx
from onnx import helper, numpy_helper

MICROSOFT = "com.microsoft"  # onnxruntime's own operators


@contextlib.contextmanager
def eager_attention(model):
    """Trace `model` with its eager attention (see the module docstring); restores its implementation after."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        yield model
    finally:
        model.set_attn_implementation(previous)


def flatten_layer_norms(model: onnx.ModelProto) -> int:
    """Run every last-axis `LayerNormalization` of `model` (in place) on its input viewed as `(-1, hidden)`, and
    view the result back in the input's shape; returns how many were rewritten. One whose input the exporter
    recorded as `(tokens, hidden)` already is left as it is."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    ranks = {
        v.name: len(v.type.tensor_type.shape.dim) for v in model.graph.value_info if v.type.HasField("tensor_type")
    }
    nodes, rewritten = [], 0
    for node in model.graph.node:
        axis = next((helper.get_attribute_value(a) for a in node.attribute if a.name == "axis"), -1)
        scale = initializers.get(node.input[1]) if len(node.input) > 1 else None
        plain = node.op_type == "LayerNormalization" and node.domain in ("", "ai.onnx") and len(node.output) == 1
        if not plain or axis != -1 or scale is None or ranks.get(node.input[0]) == 2:
            nodes.append(node)
            continue
        hidden = int(numpy_helper.to_array(scale).shape[-1])
        source, target = node.input[0], node.output[0]
        prefix = f"{node.name or target}_flat"
        shape_2d = helper.make_tensor(f"{prefix}_shape", onnx.TensorProto.INT64, [2], [-1, hidden])
        model.graph.initializer.append(shape_2d)
        nodes += [
            helper.make_node("Shape", [source], [f"{prefix}_input_shape"], name=f"{prefix}_input_shape"),
            helper.make_node("Reshape", [source, shape_2d.name], [f"{prefix}_in"], name=f"{prefix}_in"),
            helper.make_node(
                "LayerNormalization",
                [f"{prefix}_in", *node.input[1:]],
                [f"{prefix}_out"],
                name=node.name,
                axis=-1,
                **{a.name: helper.get_attribute_value(a) for a in node.attribute if a.name != "axis"},
            ),
            helper.make_node("Reshape", [f"{prefix}_out", f"{prefix}_input_shape"], [target], name=f"{prefix}_out"),
        ]
        rewritten += 1
    replace_nodes(model, nodes)
    return rewritten


def constant_value(model: onnx.ModelProto, name: str):
    """The value of `name` when it is an initializer or a `Constant` node's output, else None."""
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return numpy_helper.to_array(tensor)
    for node in model.graph.node:
        if node.op_type == "Constant" and node.output[0] == name:
            return numpy_helper.to_array(node.attribute[0].t) if node.attribute[0].name == "value" else None
    return None


def fold_weight_views(model: onnx.ModelProto) -> int:
    """Replace (in place) every view of an initializer by a constant shape or index (`Gather` of one index along
    axis 0, `Reshape`, `Transpose`) by an initializer of its own (a slice is named `{stacked}.{index}`), chains
    included, and drop the initializers nothing reads any more. Returns how many views were folded."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    renamed, nodes = {}, []
    for node in model.graph.node:
        node.input[:] = [renamed.get(name, name) for name in node.input]
        value = view_of_weight(model, node, initializers)
        if value is None:
            nodes.append(node)
            continue
        name, array = value
        if name not in initializers:
            initializers[name] = numpy_helper.from_array(np.ascontiguousarray(array), name)
            model.graph.initializer.append(initializers[name])
        renamed[node.output[0]] = name
    if any(output.name in renamed for output in model.graph.output):
        raise ValueError("a graph output is a view of a weight; not rewritten")
    replace_nodes(model, nodes)
    return len(renamed)


def view_of_weight(model: onnx.ModelProto, node, initializers: dict):
    """`(name, value)` of `node`'s output when it is a constant view of an initializer, else None."""
    if node.op_type not in ("Gather", "Reshape", "Transpose") or node.domain not in ("", "ai.onnx"):
        return None
    if not node.input or node.input[0] not in initializers:
        return None
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    data = numpy_helper.to_array(initializers[node.input[0]])
    if node.op_type == "Transpose":
        return f"{node.output[0]}", data.transpose(attrs.get("perm"))
    other = constant_value(model, node.input[1])
    if other is None:
        return None
    if node.op_type == "Gather":
        if attrs.get("axis", 0) != 0 or other.ndim != 0:
            return None
        return f"{node.input[0]}.{int(other)}", data[int(other)]
    shape = [data.shape[i] if d == 0 and not attrs.get("allowzero", 0) else int(d) for i, d in enumerate(other)]
    return f"{node.output[0]}", data.reshape(shape)


def gemm_as_matmul(model: onnx.ModelProto) -> int:
    """Write (in place) every `Gemm` whose `B` is an initializer, with `alpha = beta = 1` and `A` not transposed,
    as `MatMul` by `B` (transposed ahead of time where `transB`) plus `Add` of `C`. Returns the count."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    nodes, rewritten = [], 0
    for node in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        plain = attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0 and not attrs.get("transA", 0)
        if node.op_type != "Gemm" or not plain or node.input[1] not in initializers:
            nodes.append(node)
            continue
        weight = node.input[1]
        if attrs.get("transB", 0):
            weight = f"{node.input[1]}.T"
            if weight not in initializers:
                value = numpy_helper.to_array(initializers[node.input[1]]).T.copy()
                initializers[weight] = numpy_helper.from_array(value, weight)
                model.graph.initializer.append(initializers[weight])
        name = node.name or node.output[0]
        bias = len(node.input) > 2 and node.input[2]
        product = f"{name}_matmul" if bias else node.output[0]
        nodes.append(helper.make_node("MatMul", [node.input[0], weight], [product], name=f"{name}_MatMul"))
        if bias:
            nodes.append(helper.make_node("Add", [product, node.input[2]], [node.output[0]], name=f"{name}_Add"))
        rewritten += 1
    replace_nodes(model, nodes)
    return rewritten


def replace_nodes(model: onnx.ModelProto, nodes: list) -> None:
    """Make `nodes` the graph's nodes and drop the initializers that no node (nor subgraph) reads any more."""
    del model.graph.node[:]
    model.graph.node.extend(nodes)

    def read(graph) -> set[str]:
        names = {o.name for o in graph.output}
        for node in graph.node:
            names.update(node.input)
            for attribute in node.attribute:
                for sub in [attribute.g, *attribute.graphs] if attribute.HasField("g") or attribute.graphs else []:
                    names |= read(sub)
        return names

    used = read(model.graph)
    kept = [t for t in model.graph.initializer if t.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)


def transposed_operands_in_matmul(model: onnx.ModelProto) -> int:
    """Where a `Transpose` moves its input's innermost axis and feeds only `MatMul`s as their second input (the
    keys of attention, `(batch, seq, heads, dim)` to `(batch, heads, dim, seq)`), write (in place) the transpose
    without that move and the `MatMul`s as onnxruntime's `FusedMatMul` with `transB`, whose GEMM reads the
    operand transposed at no cost. Returns how many transposes were rewritten. onnxruntime-only (`com.microsoft`):
    for the int8 file, which only onnxruntime runs fast (`convert/onnx_int8.py`)."""
    readers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    read_transposed, nodes, outputs, rewritten = {}, [], {o.name for o in model.graph.output}, 0
    for node in model.graph.node:
        perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
        users = readers.get(node.output[0], []) if node.op_type == "Transpose" else []
        # the innermost axis moved to second-to-last (one swap undoes it), read only as a MatMul's second operand
        moved = perm is not None and len(perm) >= 2 and perm[-2] == len(perm) - 1
        operand = users and all(second_operand_of_matmul(u, node.output[0]) for u in users)
        if moved and operand and node.output[0] not in outputs:
            rows_kept = perm[:-2] + [perm[-1], perm[-2]]  # the same transpose, but the innermost axis stays
            name = node.input[0]
            if rows_kept != sorted(rows_kept):  # else the swap was the whole transpose: none is left
                name = f"{node.name or node.output[0]}_rows"
                nodes.append(helper.make_node("Transpose", [node.input[0]], [name], name=name, perm=rows_kept))
            read_transposed.update({id(user): name for user in users})
            rewritten += 1
        elif id(node) in read_transposed:
            inputs, fused = [node.input[0], read_transposed[id(node)]], {"transB": 1, "alpha": 1.0}
            nodes.append(helper.make_node("FusedMatMul", inputs, node.output, node.name, domain=MICROSOFT, **fused))
        else:
            nodes.append(node)
    if rewritten and not any(o.domain == MICROSOFT for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MICROSOFT, 1))
    replace_nodes(model, nodes)
    return rewritten


def second_operand_of_matmul(node, name: str) -> bool:
    """Whether `node` is a standard `MatMul` that reads `name` as its second input only."""
    plain = node.op_type == "MatMul" and node.domain in ("", "ai.onnx")
    return plain and node.input[1] == name and node.input[0] != name


def fastest_layout(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every rewrite above, in place, on a traced graph; returns `model`."""
    fold_weight_views(model)
    gemm_as_matmul(model)
    flatten_layer_norms(model)
    return model


__all__ = [
    "eager_attention",
    "flatten_layer_norms",
    "fold_weight_views",
    "gemm_as_matmul",
    "fastest_layout",
    "transposed_operands_in_matmul",
]
