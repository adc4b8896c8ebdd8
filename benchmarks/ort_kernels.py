"""onnxruntime's fused SkipLayerNormalization kernel against the Add + LayerNormalization it replaces.

    python -m benchmarks.ort_kernels
    python -m benchmarks.ort_kernels --shapes 32x16,32x128 --threads 2

onnxruntime fuses a residual `Add` of two rank-3 tensors followed by `LayerNormalization` into its contrib
`SkipLayerNormalization` kernel. This script builds that two-node graph (hidden 384, MiniLM's) and times it
as onnxruntime's default optimisations run it (fused) against the same graph with the fusion disabled
(`disabled_optimizers=["SkipLayerNormFusion"]`), and against the flattened form the exporter writes
(`convert/onnx_layout.flatten_layer_norms`: the `LayerNormalization` on `(tokens, hidden)`, which the fusion
does not match). Medians of interleaved rounds; ratio = fused time / unfused time (above 1: the fusion is slower).
"""

from __future__ import annotations

import numpy as np

from benchmarks.common import cpu_description, median_milliseconds
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

HIDDEN = 384


def residual_layer_norm(flatten: bool):
    """The ModelProto of `LayerNormalization(x + skip)` over `(batch, seq, hidden)` inputs."""
    from onnx import TensorProto, helper, numpy_helper

    from moe_embed.convert.onnx_layout import flatten_layer_norms

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", HIDDEN]) for n in ("x", "skip")]
    output = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", HIDDEN])
    weights = [numpy_helper.from_array(np.full(HIDDEN, value, np.float32), n) for n, value in (("g", 1.0), ("b", 0.0))]
    nodes = [
        helper.make_node("Add", ["x", "skip"], ["sum"]),
        helper.make_node("LayerNormalization", ["sum", "g", "b"], ["y"], axis=-1, epsilon=1e-12),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "residual_layer_norm", inputs, [output], weights),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    if flatten:
        flatten_layer_norms(model)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", default="32x16,32x128,128x128", help="comma-separated batch x tokens")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    args = parse(parser, argv)
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads

    def session(flatten: bool, disabled: list[str]):
        model = residual_layer_norm(flatten).SerializeToString()
        return onnxruntime.InferenceSession(
            model, options, providers=["CPUExecutionProvider"], disabled_optimizers=disabled
        )

    sessions = {
        "fused (default)": session(False, []),
        "Add + LayerNorm": session(False, ["SkipLayerNormFusion"]),
        "flattened (export)": session(True, []),
    }
    print(f"onnxruntime {onnxruntime.__version__}, {args.threads} threads; {cpu_description()}")
    print("| batch | tokens | " + " | ".join(f"{name} ms" for name in sessions) + " | fused / Add + LayerNorm |")
    print("|---:|---:|" + "---:|" * (len(sessions) + 1))
    rng = np.random.default_rng(0)
    for shape in args.shapes.split(","):
        batch, seq = (int(v) for v in shape.split("x"))
        feed = {n: rng.normal(size=(batch, seq, HIDDEN)).astype(np.float32) for n in ("x", "skip")}
        median = median_milliseconds(sessions, feed, args.repeats, args.min_time)
        cells = " | ".join(f"{value:.3f}" for value in median.values())
        ratio = median["fused (default)"] / median["Add + LayerNorm"]
        print(f"| {batch} | {seq} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    run_cli(main)
