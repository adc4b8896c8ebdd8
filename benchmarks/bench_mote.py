"""Encode throughput of a dense base (the bundled MiniLM unless `--base`) against the upcycled MoTE, measured in the
same run.

    python -m benchmarks.bench_mote                      # batch 1, 32, 128 x 16 and 256 tokens
    python -m benchmarks.bench_mote --batch-sizes 32 --seq-lens 16 --repeats 5
    python -m benchmarks.bench_mote --base "$(python scripts/fetch_mpnet.py)"   # all-mpnet-base-v2

For each shape it times forward passes (no grad, fp32) of the base in transformers' own class (`BertModel`,
`MPNetModel`, `ModernBertModel`: the dense baseline, with its default attention, which MoTE then runs too), MoTE on
a single-task batch, and MoTE on a mixed-task batch (rows cycling through the four tasks). Inputs start with the
task prefixes, so MoTE routes by prefix detection, as in use. Models are timed in interleaved rounds; the table
shows the median sequences/s of each and the ratio MoTE/dense. Targets: single-task >= 0.97, mixed >= 0.90.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch
from tqdm.auto import tqdm

from benchmarks.common import attention_of, dense_base, load_dense, prepare, random_ids, time_forward, timing_parser
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.errors import run_cli
from moe_embed.modeling.modeling_mote import MoteBertModel
from moe_embed.options import parse


def make_batch(prefix_ids: list[list[int]], batch_size: int, seq_len: int, vocab_size: int, generator) -> dict:
    """`batch_size` rows of exactly `seq_len` random tokens; row i starts with prefix i mod len(prefix_ids)."""
    rows = []
    for i in range(batch_size):
        prefix = prefix_ids[i % len(prefix_ids)]
        rows.append(prefix + random_ids(vocab_size, 1, seq_len - len(prefix), generator)[0].tolist())
    input_ids = torch.tensor(rows)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}


def main(argv: list[str] | None = None) -> None:
    args = parse(timing_parser(__doc__, "an upcycled MoTE folder (default: upcycle the bundled MiniLM)"), argv)

    dense = load_dense(dense_base(args))
    attention = attention_of(dense)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            folder = str(Path(tmp) / "mote")
            upcycle(upcycle_options(output=folder, base=args.base, verify=False))
        mote = MoteBertModel.from_pretrained(folder, attn_implementation=attention).eval()
    prefix_ids = [mote.config.task_prefix_ids[t] for t in mote.config.tasks]

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, {type(dense).__name__} and MoTE with "
        f"{attention} attention; median of {args.repeats} rounds"
    )
    print("| batch | tokens | dense seq/s | MoTE single seq/s | ratio | MoTE mixed seq/s | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    generator = torch.Generator().manual_seed(0)
    for batch_size, seq_len in tqdm(prepare(args), desc="shapes", file=sys.stderr):
        single = make_batch(prefix_ids[:1], batch_size, seq_len, mote.config.vocab_size, generator)
        mixed = make_batch(prefix_ids, batch_size, seq_len, mote.config.vocab_size, generator)
        runs = {"dense": [], "single": [], "mixed": []}
        time_forward(dense, single, 0.05), time_forward(mote, single, 0.05), time_forward(mote, mixed, 0.05)  # warm-up
        for _ in range(args.repeats):
            runs["dense"].append(time_forward(dense, single, args.min_time))
            runs["single"].append(time_forward(mote, single, args.min_time))
            runs["mixed"].append(time_forward(mote, mixed, args.min_time))
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(
            f"| {batch_size} | {seq_len} | {med['dense']:.1f} | {med['single']:.1f} "
            f"| {med['single'] / med['dense']:.3f} "
            f"| {med['mixed']:.1f} | {med['mixed'] / med['dense']:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    run_cli(main)
