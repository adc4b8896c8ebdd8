"""Rows per second of one onnxruntime session, alone in this process: what `bench_serving --fresh-rounds` runs
in a new process for each timing, so that no other session, model or thread pool of the benchmark shares it.

    python -m benchmarks.session_rate FOLDER/onnx/model_qint8_avx512_vnni.onnx FEED.npz --threads 2

FEED is an `.npz` of the graph's inputs (extra arrays are ignored); the rates count its first axis. Prints two
rates: over every call of the timing, and of its fastest call. On a shared machine the first includes what
the host's other tenants take from this one; the second is the graph's own cost with the least of that (the
convention of Python's `timeit`: slower repeats are interference, not the code).
"""

from __future__ import annotations

import time
from pathlib import Path

from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse


def call_seconds(session, feed: dict, min_time: float) -> list[float]:
    """Seconds of each `session.run(None, feed)`, calling it until `min_time` seconds pass (at least once)."""
    times, end = [], time.perf_counter() + min_time
    while not times or time.perf_counter() < end:
        start = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - start)
    return times


def seconds_per_call(session, feed: dict, min_time: float) -> float:
    """Mean seconds per `session.run(None, feed)` over at least `min_time` seconds (`call_seconds`)."""
    times = call_seconds(session, feed, min_time)
    return sum(times) / len(times)


def session_rates(model: Path, feed: dict, threads: int, min_time: float) -> tuple[float, float]:
    """Rows of `feed` per second through `model` over at least `min_time` seconds after two warm-up calls, and
    in the fastest of those calls."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    names = {i.name for i in session.get_inputs()}
    feed = {name: value for name, value in feed.items() if name in names}
    for _ in range(2):
        session.run(None, feed)
    times = call_seconds(session, feed, min_time)
    rows = next(iter(feed.values())).shape[0]
    return rows * len(times) / sum(times), rows / min(times)


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="an .onnx file")
    parser.add_argument("feed", type=Path, help="an .npz of its inputs")
    parser.add_argument("--threads", type=int, default=2, help="onnxruntime intra-op threads")
    parser.add_argument("--min-time", type=float, default=1.0, help="seconds of calls")
    args = parse(parser, argv)
    for path, suffix in ((args.model, ".onnx"), (args.feed, ".npz")):
        if not path.is_file() or path.suffix != suffix:
            parser.error(f"expected an existing {suffix} file, got {path}")
    import numpy as np

    with np.load(args.feed, allow_pickle=False) as arrays:
        feed = dict(arrays)
    print(" ".join(f"{rate:.3f}" for rate in session_rates(args.model, feed, args.threads, args.min_time)))


if __name__ == "__main__":
    run_cli(main)
