"""What a mixed-task batch costs the routed MoTE graph in onnxruntime int8: one feed-forward block on all of a
batch's tokens against four experts on a quarter of them each.

    python -m benchmarks.expert_split
    python -m benchmarks.expert_split --tokens 512,4096 --threads 2

A routed MoTE graph runs each expert layer as the exporter writes it (`modeling/modeling_mote.py`): one `Split`
of the task-sorted tokens, each expert's LayerNorm, two matmuls, Gelu and residual on its run, one `Concat`.
This script builds that block at MiniLM's sizes (hidden 384, intermediate 1536, `--layers` of them) and times
four variants, quantised as the export quantises (`moe_embed.convert.onnx_int8.quantize`: per-channel QInt8 MatMul
weights), on the same tokens split into four equal runs:

- `one FFN`: the dense model's block on every token (what a one-task batch costs);
- `4 experts`: the routed graph's layout, each expert with its own weights;
- `4 x shared weights`: the same layout, the four experts reading one set of weights (the same bytes as
  `one FFN`: separates the weights' size from the split itself);
- `stacked`: the four experts' weights stacked, one batched MatMul over `(experts, tokens / 4, hidden)`.
  onnxruntime's `DynamicQuantizeMatMul` refuses per-channel zero points on 3-D weights, so this variant's
  weights are quantised per tensor (the export's agreement check refuses per-tensor MoTE graphs: cosine 0.935,
  `benchmarks/int8_settings.py`); its time is a bound on what the layout could give, not a servable graph;
- `QMoE`: onnxruntime's own fused mixture-of-experts operator (`com.microsoft.QMoE`, top-1 of a one-hot
  router, 8-bit weights in blocks of `QMOE_BLOCK` along the input, int8 activations: `accuracy_level=4`) on the
  unsorted tokens: each expert's first LayerNorm folded into its up-projection, the residual's and the last
  LayerNorm's per-expert scale and shift gathered per token around unit LayerNorms.

`--tokens 512` is a batch of 32 texts of 16 tokens, `4096` the same batch at 128 tokens. Medians of
rounds, each opening its sessions anew (`timed_rounds`); ratios are to `one FFN` on the same tokens (above 1:
slower).
"""

from __future__ import annotations

import statistics
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.common import cpu_description, median_milliseconds
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

HIDDEN, INTERMEDIATE, EXPERTS = 384, 1536, 4
VARIANTS = ("one FFN", "4 experts", "4 x shared weights", "stacked", "QMoE")
QMOE_BLOCK = 128  # input features per weight scale of the QMoE variant


def block_weights(rng) -> dict[str, np.ndarray]:
    """One feed-forward block's weights, at MiniLM's sizes."""
    shapes = {"w1": (HIDDEN, INTERMEDIATE), "b1": (INTERMEDIATE,), "w2": (INTERMEDIATE, HIDDEN), "b2": (HIDDEN,)}
    weights = {name: rng.normal(0, 0.05, shape).astype(np.float32) for name, shape in shapes.items()}
    weights["gamma"] = 1 + rng.normal(0, 0.05, HIDDEN).astype(np.float32)
    weights["beta"] = rng.normal(0, 0.05, HIDDEN).astype(np.float32)
    return weights


def block_nodes(x: str, out: str, weights: str, tag: str, affine_norm: bool = True) -> list:
    """LayerNorm, up-projection, Gelu, down-projection, residual, LayerNorm: an expert as the export writes it.
    `weights`: the name prefix of its initialisers. `affine_norm=False`: unit norms, then the weights' scale
    and shift as Mul and Add (what stacked norm weights need: LayerNormalization's scale is one vector)."""
    from onnx import helper

    def norm(source: str, target: str) -> list:
        if affine_norm:
            return [helper.make_node("LayerNormalization", [source, f"{weights}gamma", f"{weights}beta"], [target])]
        unit = [source, "unit_scale", "unit_shift"]
        return [
            helper.make_node("LayerNormalization", unit, [f"{target}_unit"]),
            helper.make_node("Mul", [f"{target}_unit", f"{weights}gamma"], [f"{target}_scaled"]),
            helper.make_node("Add", [f"{target}_scaled", f"{weights}beta"], [target]),
        ]

    t = tag
    return [
        *norm(x, f"{t}norm"),
        helper.make_node("MatMul", [f"{t}norm", f"{weights}w1"], [f"{t}up"]),
        helper.make_node("Add", [f"{t}up", f"{weights}b1"], [f"{t}up_bias"]),
        helper.make_node("Gelu", [f"{t}up_bias"], [f"{t}act"]),
        helper.make_node("MatMul", [f"{t}act", f"{weights}w2"], [f"{t}down"]),
        helper.make_node("Add", [f"{t}down", f"{weights}b2"], [f"{t}down_bias"]),
        helper.make_node("Add", [f"{t}down_bias", f"{t}norm"], [f"{t}residual"]),
        *norm(f"{t}residual", out),
    ]


def qmoe_weights(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`(experts, out, in)` fp32 weights as QMoE reads 8-bit ones: symmetric, `QMOE_BLOCK` inputs per scale,
    stored as uint8 around 128; and the scales `(experts, out, in / QMOE_BLOCK)`."""
    experts, rows, columns = weights.shape
    blocks = weights.reshape(experts, rows, columns // QMOE_BLOCK, QMOE_BLOCK)
    scales = np.abs(blocks).max(axis=-1) / 127
    quantised = np.clip(np.round(blocks / scales[..., None]), -127, 127) + 128
    return quantised.astype(np.uint8).reshape(weights.shape), scales.astype(np.float32)


def qmoe_layer(x: str, out: str, experts: list[dict], tag: str) -> tuple[list, dict]:
    """An expert layer as one QMoE node (see the module docstring): nodes and initialisers. Reads the graph's
    `router` (one-hot logits) and `expert_ids` (each token's expert)."""
    from onnx import helper

    t = tag
    stack = {n: np.stack([e[n] for e in experts]) for n in experts[0]}
    up = stack["gamma"][:, :, None] * stack["w1"]  # LayerNorm's scale folded into the up-projection
    up_bias = np.einsum("eh,ehi->ei", stack["beta"], stack["w1"]) + stack["b1"]  # and its shift
    w1, s1 = qmoe_weights(up.transpose(0, 2, 1))
    w2, s2 = qmoe_weights(stack["w2"].transpose(0, 2, 1))
    initialisers = {
        f"{t}w1": w1,
        f"{t}s1": s1,
        f"{t}b1": up_bias.astype(np.float32),
        f"{t}w2": w2,
        f"{t}s2": s2,
        f"{t}b2": (stack["b2"] + stack["beta"]).astype(np.float32),  # the residual's shift
        f"{t}gamma": stack["gamma"],  # each expert's two norms share a scale and shift (`block_nodes`)
        f"{t}beta": stack["beta"],
    }
    ffn = [f"{t}norm", "router", f"{t}w1", f"{t}s1", f"{t}b1", f"{t}w2", f"{t}s2", f"{t}b2"]
    nodes = [
        helper.make_node("LayerNormalization", [x, "unit_scale", "unit_shift"], [f"{t}norm"]),
        helper.make_node(
            "QMoE",
            ffn,
            [f"{t}ffn"],
            domain="com.microsoft",
            k=1,
            activation_type="gelu",
            expert_weight_bits=8,
            block_size=QMOE_BLOCK,
            normalize_routing_weights=1,
            accuracy_level=4,
        ),
        helper.make_node("Gather", [f"{t}gamma", "expert_ids"], [f"{t}token_gamma"]),
        helper.make_node("Mul", [f"{t}norm", f"{t}token_gamma"], [f"{t}scaled"]),
        helper.make_node("Add", [f"{t}ffn", f"{t}scaled"], [f"{t}residual"]),
        helper.make_node("LayerNormalization", [f"{t}residual", "unit_scale", "unit_shift"], [f"{t}out_unit"]),
        helper.make_node("Mul", [f"{t}out_unit", f"{t}token_gamma"], [f"{t}out_scaled"]),
        helper.make_node("Gather", [f"{t}beta", "expert_ids"], [f"{t}token_beta"]),
        helper.make_node("Add", [f"{t}out_scaled", f"{t}token_beta"], [out]),
    ]
    return nodes, initialisers


def routing_nodes() -> list:
    """`expert_ids` (each token's expert: `counts` tokens of expert 0, then of expert 1, ...) and `router`
    (their one-hot logits), as the QMoE variant reads them."""
    from onnx import helper

    return [
        helper.make_node("CumSum", ["counts", "axis0"], ["ends"]),
        helper.make_node("Shape", ["x"], ["x_shape"], end=1),
        helper.make_node("Squeeze", ["x_shape"], ["tokens"]),
        helper.make_node("Range", ["zero", "tokens", "one"], ["positions"]),
        helper.make_node("Unsqueeze", ["positions", "axis1"], ["column"]),
        helper.make_node("GreaterOrEqual", ["column", "ends"], ["past"]),  # (tokens, experts): runs behind
        helper.make_node("Cast", ["past"], ["past_count"], to=7),  # int64
        helper.make_node("ReduceSum", ["past_count", "axis1"], ["expert_ids"], keepdims=0),
        helper.make_node("OneHot", ["expert_ids", "depth", "router_values"], ["router"], axis=-1),
    ]


def build(variant: str, layers: int, seed: int = 0):
    """The ModelProto of `layers` blocks of `variant` over `x` of shape `(tokens, hidden)`; `counts` (4 tokens
    per expert, summing to the tokens) is an input of every variant. Every variant's first expert, and `one
    FFN`'s block, have the same weights, so `4 x shared weights` computes what `one FFN` does, and `stacked`
    what `4 experts` does."""
    from onnx import TensorProto, helper, numpy_helper

    initialisers, nodes, x = {}, [], "x"
    if variant in ("stacked", "QMoE"):  # unit LayerNorms, each expert's scale and shift applied after them
        initialisers.update(unit_scale=np.ones(HIDDEN, np.float32), unit_shift=np.zeros(HIDDEN, np.float32))
    for layer in range(layers):
        rng = np.random.default_rng(seed + layer)
        experts = [block_weights(rng) for _ in range(EXPERTS)]
        out = f"layer{layer}"
        if variant == "QMoE":
            layer_nodes, layer_weights = qmoe_layer(x, out, experts, f"l{layer}_")
            nodes += layer_nodes
            initialisers.update(layer_weights)
        elif variant == "one FFN":
            initialisers.update({f"l{layer}_{n}": w for n, w in experts[0].items()})
            nodes += block_nodes(x, out, f"l{layer}_", f"l{layer}_")
        elif variant == "stacked":
            stacked = {n: np.stack([e[n] for e in experts]) for n in experts[0]}  # vectors broadcast per token:
            stacked = {n: w[:, None, :] if w.ndim == 2 else w for n, w in stacked.items()}  # (experts, 1, size)
            initialisers.update({f"l{layer}_{n}": w for n, w in stacked.items()})
            initialisers.update(
                {f"l{layer}_grouped": np.array([EXPERTS, -1, HIDDEN]), f"l{layer}_flat": np.array([-1, HIDDEN])}
            )
            nodes.append(helper.make_node("Reshape", [x, f"l{layer}_grouped"], [f"l{layer}_groups"]))
            nodes += block_nodes(f"l{layer}_groups", f"l{layer}_out", f"l{layer}_", f"l{layer}_", affine_norm=False)
            nodes.append(helper.make_node("Reshape", [f"l{layer}_out", f"l{layer}_flat"], [out]))
        else:
            parts = [f"l{layer}_part{e}" for e in range(EXPERTS)]
            nodes.append(helper.make_node("Split", [x, "counts"], parts, axis=0))
            for e, part in enumerate(parts):
                own = variant == "4 experts" or e == 0
                if own:
                    initialisers.update({f"l{layer}e{e}_{n}": w for n, w in experts[e].items()})
                prefix = f"l{layer}e{e if own else 0}_"
                nodes += block_nodes(part, f"{part}_out", prefix, f"l{layer}e{e}_")
            nodes.append(helper.make_node("Concat", [f"{p}_out" for p in parts], [out], axis=0))
        x = out
    imports = [helper.make_opsetid("", 20)]  # 20: the standard Gelu
    if variant == "QMoE":
        nodes = routing_nodes() + nodes
        imports.append(helper.make_opsetid("com.microsoft", 1))
        initialisers.update(
            axis0=np.array(0),
            axis1=np.array([1]),
            zero=np.array(0),
            one=np.array(1),
            depth=np.array(EXPERTS),
            router_values=np.array([-1e4, 0], np.float32),  # off, on: the softmax of one logit is 1
        )
    graph = helper.make_graph(
        nodes,
        variant.replace(" ", "_"),
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", HIDDEN]),
            helper.make_tensor_value_info("counts", TensorProto.INT64, [EXPERTS]),
        ],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["tokens", HIDDEN])],
        [numpy_helper.from_array(w, name) for name, w in initialisers.items()],
    )
    return helper.make_model(graph, opset_imports=imports)


def int8_files(layers: int, work: Path) -> dict[str, Path]:
    """Variant -> its int8 graph, written under `work`."""
    import onnx

    from moe_embed.convert.onnx_int8 import quantize

    files = {}
    for variant in VARIANTS:
        fp32, files[variant] = work / f"{variant}.onnx", work / f"{variant}-int8.onnx"
        onnx.save(build(variant, layers), fp32)
        quantize(fp32, files[variant], per_channel=variant != "stacked")  # see the module docstring
    return files


def timed_rounds(files: dict[str, Path], feed: dict, args) -> dict[str, list[float]]:
    """Milliseconds per call of each variant in each of `args.repeats` rounds. Every round opens new sessions,
    in an order rotated by one from the last round's: a session's speed depends on where its buffers land
    (the same graph measured 50 or 67 ms at 4096 tokens depending on the order its sessions were opened), so
    no variant keeps one lucky or unlucky layout."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = args.threads
    times = {variant: [] for variant in files}
    for round_ in range(args.repeats):
        order = [*files][round_ % len(files) :] + [*files][: round_ % len(files)]
        sessions = {
            v: onnxruntime.InferenceSession(str(files[v]), options, providers=["CPUExecutionProvider"]) for v in order
        }
        for variant, value in median_milliseconds(sessions, feed, 1, args.min_time).items():
            times[variant].append(value)
        del sessions
    return times


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", default="512,4096", help="comma-separated tokens per call (multiples of 4)")
    parser.add_argument("--layers", type=int, default=3, help="expert layers (the routed MiniLM MoTE has 3)")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--repeats", type=int, default=8, help="rounds, each with newly opened sessions")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    args = parse(parser, argv)
    tokens = [int(t) for t in args.tokens.split(",")]
    if any(t <= 0 or t % EXPERTS for t in tokens):
        parser.error(f"--tokens must be positive multiples of {EXPERTS} (equal runs per expert), got {args.tokens}")
    import onnxruntime

    with tempfile.TemporaryDirectory() as tmp:
        files = int8_files(args.layers, Path(tmp))
        print(
            f"onnxruntime {onnxruntime.__version__}, {args.threads} threads, {args.layers} layers; {cpu_description()}"
        )
        print(f"median ms per call of {args.repeats} rounds (fastest-slowest round); ratio of medians to one FFN")
        print("| tokens | " + " | ".join(f"{v} ms" for v in VARIANTS) + " | " + " | ".join(VARIANTS[1:]) + " |")
        print("|---:|" + "---:|" * (2 * len(VARIANTS) - 1))
        rng = np.random.default_rng(0)
        for count in tokens:
            feed = {
                "x": rng.normal(size=(count, HIDDEN)).astype(np.float32),
                "counts": np.full(EXPERTS, count // EXPERTS, dtype=np.int64),
            }
            times = timed_rounds(files, feed, args)
            median = {v: statistics.median(t) for v, t in times.items()}
            cells = " | ".join(f"{median[v]:.2f} ({min(times[v]):.2f}-{max(times[v]):.2f})" for v in VARIANTS)
            ratios = " | ".join(f"{median[v] / median['one FFN']:.2f}" for v in VARIANTS[1:])
            print(f"| {count} | {cells} | {ratios} |", flush=True)


if __name__ == "__main__":
    run_cli(main)
