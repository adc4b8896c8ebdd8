"""What the throughput benchmarks share: command-line options and the timing loop."""

from __future__ import annotations

import argparse
import time

import torch


def timing_parser(description: str, model_help: str) -> argparse.ArgumentParser:
    """Parser with the options every throughput benchmark takes."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-sizes", default="1,32,128", help="comma-separated batch sizes")
    parser.add_argument("--seq-lens", default="16,256", help="comma-separated sequence lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds per shape")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--model", default=None, help=model_help)
    return parser


def prepare(args) -> list[tuple[int, int]]:
    """Apply `--threads`; return the (batch size, sequence length) pairs to time, sequence length outermost."""
    if args.threads:
        torch.set_num_threads(args.threads)
    return [(b, s) for s in map(int, args.seq_lens.split(",")) for b in map(int, args.batch_sizes.split(","))]


def time_forward(model, batch: dict, min_time: float) -> float:
    """Sequences per second of `model(**batch)`, repeating calls until `min_time` seconds pass."""
    calls, start = 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            model(**batch)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return calls * batch["input_ids"].shape[0] / elapsed
