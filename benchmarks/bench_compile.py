"""Encode throughput of MoTE under `torch.compile` against eager PyTorch, in the same run.

    python -m benchmarks.bench_compile                         # batch 32 and 128 x 64 tokens
    python -m benchmarks.bench_compile --batch-sizes 8 --seq-lens 16 --repeats 1

The bundled MiniLM upcycled to MoTE (`--model` for another MoTE folder), compiled with the default
inductor backend, in three ways: one named task (`task="query"`, `fullgraph=True`); a batch mixing the
four tasks by their prefixes (routed inside the graph) with
`torch._dynamo.config.capture_dynamic_output_shape_ops = True`, which makes it one graph; and the same
batch with dynamo's defaults, where the routing breaks the graph. For each it prints the seconds of
the first calls (compilation, all shapes), the number of graphs compiled, and the median sequences/s
compiled and eager, in interleaved rounds, with the ratio compiled / eager.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from benchmarks.common import batch_of, median_rates, prepare, timing_parser
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.errors import run_cli
from moe_embed.modeling.modeling_mote import MoteBertModel
from moe_embed.options import parse

VARIANTS = {
    "task='query', fullgraph": ({"task": "query"}, True, True),
    "mixed tasks, dynamic output shapes": ({}, True, True),
    "mixed tasks, dynamo defaults": ({}, False, False),
}


def bench(model, name: str, shapes, args) -> list[str]:
    kwargs, capture, fullgraph = VARIANTS[name]
    torch._dynamo.reset()
    counters.clear()
    rows = []
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=capture):
        compiled = torch.compile(model, fullgraph=fullgraph, backend=args.backend)
        batches = []
        for batch_size, seq_len in shapes:
            batch = batch_of(model, batch_size, seq_len)
            if kwargs:
                batch = {**{k: v for k, v in batch.items() if k != "task_ids"}, **kwargs}
            batches.append(batch)
        start = time.perf_counter()
        with torch.inference_mode():
            for batch in batches + batches:  # second pass: recompilation with dynamic sizes, if any
                compiled(**batch)
        compile_seconds = time.perf_counter() - start
        graphs = counters["stats"]["unique_graphs"]
        for (batch_size, seq_len), batch in zip(shapes, batches, strict=True):
            rates = median_rates({"eager": model, "compiled": compiled}, batch, args.repeats, args.min_time)
            eager, fast = rates["eager"], rates["compiled"]
            rows.append(
                f"| {name} | {batch_size} | {seq_len} | {eager:.1f} | {fast:.1f} | {fast / eager:.2f} "
                f"| {graphs} | {compile_seconds:.0f} |"
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__.split("\n\n")[0], "MoTE folder (default: the bundled MiniLM upcycled)")
    parser.set_defaults(batch_sizes="32,128", seq_lens="64")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default: inductor)")
    args = parse(parser, argv)
    shapes = prepare(args)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or str(Path(tmp) / "mote")
        if not args.model:
            upcycle(upcycle_options(output=folder))
        model = MoteBertModel.from_pretrained(folder).eval()
    rows = [row for name in VARIANTS for row in bench(model, name, shapes, args)]
    print("| MoTE | batch | tokens | eager (seq/s) | compiled (seq/s) | compiled / eager | graphs | compile s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    run_cli(main)
