"""What the throughput benchmarks share: command-line options and the timing loop."""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

from moe_embed.options import command_parser

if TYPE_CHECKING:
    import torch

BASE_HELP = "dense checkpoint (folder or Hub id) the benchmark starts from (default: the bundled all-MiniLM-L6-v2)"


def add_base_option(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`--base`: the dense checkpoint a benchmark upcycles, exports or compares with (`dense_base`)."""
    parser.add_argument("--base", default=None, help=BASE_HELP)
    return parser


def dense_base(args) -> str:
    """The `--base` of `args`, else the bundled all-MiniLM-L6-v2."""
    from moe_embed.folders import bundled_minilm_path

    return args.base or bundled_minilm_path()


def load_dense(path: str):
    """The dense model of a base in transformers' own class, with the attention transformers gives it by default
    (sdpa where the class supports it; MPNet's is eager only), in eval mode."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path).eval()


def attention_of(model) -> str:
    """The attention implementation a model runs (`sdpa`, `eager`): the expert models are timed with their dense
    model's, so that a ratio measures the experts and not the attention kernel."""
    return model.config._attn_implementation


def random_ids(vocab_size: int, batch_size: int, seq_len: int, generator: torch.Generator) -> torch.Tensor:
    """`(batch_size, seq_len)` random token ids past BERT's special and unused ids (a small vocabulary: its upper
    half)."""
    import torch

    return torch.randint(min(1000, vocab_size // 2), vocab_size, (batch_size, seq_len), generator=generator)


def timing_parser(description: str, model_help: str) -> argparse.ArgumentParser:
    """Parser with the options every throughput benchmark takes."""
    parser = add_base_option(command_parser(description))
    parser.add_argument("--batch-sizes", default="1,32,128", help="comma-separated batch sizes")
    parser.add_argument("--seq-lens", default="16,256", help="comma-separated sequence lengths in tokens")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds per shape")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of calls per timing")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--model", default=None, help=model_help)
    return parser


def prepare(args) -> list[tuple[int, int]]:
    """Apply `--threads`; return the (batch size, sequence length) pairs to time, sequence length outermost."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    return [(b, s) for s in map(int, args.seq_lens.split(",")) for b in map(int, args.batch_sizes.split(","))]


def time_forward(model, batch: dict, min_time: float) -> float:
    """Sequences per second of `model(**batch)`, repeating calls until `min_time` seconds pass."""
    import torch

    calls, start = 0, time.perf_counter()
    with torch.inference_mode():
        while True:
            model(**batch)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                return calls * batch["input_ids"].shape[0] / elapsed


def median_rates(models: dict, batch: dict, repeats: int, min_time: float) -> dict[str, float]:
    """Median sequences/s of each of `models` (name -> callable taking `**batch`), timed in `repeats`
    interleaved rounds so that a slow moment of the machine hits them all alike."""
    timings = {name: [] for name in models}
    for _ in range(repeats):
        for name, model in models.items():
            timings[name].append(time_forward(model, batch, min_time))
    return {name: statistics.median(values) for name, values in timings.items()}


def median_milliseconds(sessions: dict, feed: dict, repeats: int, min_time: float) -> dict[str, float]:
    """Median milliseconds per `session.run(None, feed)` of each of `sessions` (name -> onnxruntime session),
    timed in `repeats` interleaved rounds of at least `min_time` seconds each."""
    from benchmarks.session_rate import seconds_per_call

    timings = {name: [] for name in sessions}
    for _ in range(repeats):
        for name, session in sessions.items():
            timings[name].append(seconds_per_call(session, feed, min_time) * 1e3)
    return {name: statistics.median(values) for name, values in timings.items()}


def batch_of(model, batch_size: int, seq_len: int, tasks: list[str] | None = None) -> dict:
    """Random token ids, no padding; a MoTE model's rows start with the prefix of task `row % len(tasks)` (`tasks`:
    every task of the model unless given; `task_ids` -1: routed by the prefix), so that a batch mixes them."""
    import torch

    generator = torch.Generator().manual_seed(0)
    ids = random_ids(model.config.vocab_size, batch_size, seq_len, generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if model.config.model_type == "mote_bert":
        prefixes = [model.config.task_prefix_ids[t] for t in tasks or model.config.tasks]
        for row in range(batch_size):
            prefix = prefixes[row % len(prefixes)][:seq_len]
            ids[row, : len(prefix)] = torch.tensor(prefix)
        batch["task_ids"] = torch.full((batch_size,), -1)
    return batch


def cpu_description() -> str:
    """The CPU's model name, its int8 family and the flags that decide it (`convert/cpu_graph.py`, the reading the
    serving choice uses), and oneDNN's ISA cap where one is set (OpenVINO's kernels then run as on such a CPU)."""
    import os
    import platform

    from moe_embed.convert.cpu_graph import cpu_family, cpu_flags, cpuinfo_field, describe

    model = cpuinfo_field("model name")
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA")
    capped = f"; OpenVINO's oneDNN capped at {cap} (ONEDNN_MAX_CPU_ISA)" if cap else ""
    return f"CPU {model or platform.processor() or platform.machine()}, {describe(cpu_family(), cpu_flags())}{capped}"
