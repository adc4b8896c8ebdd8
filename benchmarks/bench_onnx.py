"""Encode throughput of the ONNX graphs of `convert/export_onnx.py` under onnxruntime against the same
model in PyTorch, in the same run.

    python benchmarks/bench_onnx.py                                  # batch 1, 32, 128 x 16 and 128 tokens
    python benchmarks/bench_onnx.py --batch-sizes 32 --seq-lens 32 --repeats 3

Three graphs, all from the bundled MiniLM: MoTE routed in the graph (each batch mixes the four tasks
by their prefixes), MoTE exported for one task (`--task query`, a plain graph), and the token-routed MoE
(8 experts, top-2, every other layer). PyTorch runs the model plus the same pooling and normalisation
(`SentenceEmbeddingGraph`, eager mode, sdpa attention, the model's default experts implementation);
onnxruntime runs the graph on the CPU provider with as many threads as torch. The script prints the
median sequences/s of each, in interleaved rounds, and the ratio onnxruntime / PyTorch.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from tqdm.auto import tqdm

from benchmarks.common import batch_of, median_rates, prepare, timing_parser
from convert.export_onnx import SentenceEmbeddingGraph, load_model, st_head
from convert.export_onnx import main as export_onnx
from convert.upcycle import main as upcycle


def bench_graph(name: str, source: Path, onnx_folder: Path, task: str | None, shapes, args) -> list[str]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    session = onnxruntime.InferenceSession(str(onnx_folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
    model = load_model(source, task)
    graph = SentenceEmbeddingGraph(model, st_head(source, model.config.hidden_size), task)
    inputs = [i.name for i in session.get_inputs()]
    rows = []
    for batch_size, seq_len in tqdm(shapes, desc=name, unit="shape"):
        batch = {key: value for key, value in batch_of(model, batch_size, seq_len).items() if key in inputs}
        feeds = {key: value.numpy() for key, value in batch.items()}

        def run_onnx(feeds=feeds, **_):
            return session.run(["sentence_embedding"], feeds)

        rates = median_rates({"torch": graph, "onnx": run_onnx}, batch, args.repeats, args.min_time)
        torch_rate, onnx_rate = rates["torch"], rates["onnx"]
        rows.append(
            f"| {name} | {batch_size} | {seq_len} | {torch_rate:.1f} | {onnx_rate:.1f} | {onnx_rate / torch_rate:.2f} |"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__.split("\n\n")[0], "ignored: the models are upcycled from the bundled MiniLM")
    parser.set_defaults(seq_lens="16,128")
    args = parser.parse_args(argv)
    shapes = prepare(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        upcycle(["--output", str(tmp / "mote")])
        upcycle(["--arch", "moe", "--expert-noise", "0.02", "--output", str(tmp / "moe")])
        graphs = [
            ("MoTE routed", tmp / "mote", None),
            ("MoTE --task query", tmp / "mote", "query"),
            ("MoE top-2 of 8", tmp / "moe", None),
        ]
        for name, source, task in graphs:
            out = tmp / name.replace(" ", "-")
            export_onnx([str(source), "--output", str(out), *(["--task", task] if task else [])])
            rows += bench_graph(name, source, out, task, shapes, args)
    print("| graph | batch | tokens | PyTorch (seq/s) | onnxruntime (seq/s) | onnxruntime / PyTorch |")
    print("|---|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
