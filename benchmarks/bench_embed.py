"""Rows/s of `moe-embed embed` (Ray Data) on one machine against Sentence-Transformers, in one run; its memory
at two corpus sizes; its rate per actor.

    python -m benchmarks.bench_embed                          # 10k and 50k short texts
    python -m benchmarks.bench_embed --sizes 2000 --memory-sizes 1000,10000

Every method embeds the same corpus of short texts (one sentence each, built with a fixed seed from the texts
the package ships) with the bundled all-MiniLM-L6-v2, timed end to end from a Python process that has imported
its libraries: loading the model, embedding, and for `moe-embed embed` starting Ray, planning the shards and
writing them (parquet). Methods:

- `encode`: `SentenceTransformer.encode` in this process (batch 64);
- `pool`: Sentence-Transformers' multi-process pool, one process per CPU (`start_multi_process_pool`,
  `encode(..., pool=...)`), its start and stop included;
- `ray`: `moe-embed embed` as the command runs it, a local Ray started for the job (one actor with every CPU);
- `ray-running`: the same job on a Ray that is already running (a cluster's case: `--address`);
- `ray-2x1`: two actors of one CPU each, on a running Ray;
- `ray-int8`: the dense model exported by `moe-embed export --quantize int8`, its onnxruntime int8 graph
  (`--onnx-file onnx/model_qint8_avx512_vnni.onnx`), on a running Ray.

Each method runs in a fresh process, in rounds that interleave them; the table gives the median rate and
ratios. A second table times the same runs as a shell sees them, from the process's start to its exit
(Python's start and every import included), with `moe-embed embed` run as the command itself (`cli`: a
driver that never imports torch, a Ray started for the job): what a user who runs a script or the command
waits for. A third table gives the rate of the model's calls alone: `encode`'s one call, and the sum of what
each `moe-embed embed` shard records as `embed_seconds` (the same `SentenceTransformer.encode`, inside the
actor), which separates the per-row part of the gap from the fixed one.

`--memory-sizes`: `ray-running` at corpus sizes 10x apart, in shards of `--memory-rows-per-shard` rows (so
that both sizes fill their shards), with the peak resident memory (`VmHWM`) of the driver process and of the
worker (reported by each shard): flat when the corpus streams.

`--id-check-sizes`: the job's final id check (`moe_embed.training.embed.repeated_hashes`) alone, on that many random
64-bit hashes in batches of a million (a million-row shard each), in a fresh process: its seconds and the
process's peak memory, which stays near `ID_CHECK_MIB` however many ids a corpus has.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from math import nan
from pathlib import Path

from benchmarks.common import add_base_option, cpu_description, dense_base
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

METHODS = ("encode", "pool", "ray", "ray-running", "ray-2x1", "ray-int8", "cli")
INT8_GRAPH = "onnx/model_qint8_avx512_vnni.onnx"

# One method, timed in a fresh process: prints {"seconds", "driver_mib", "model_seconds"} (`model_seconds`:
# `encode`'s call alone; `run_method` reads an embed job's from its shards).
RUN = r"""
import json, sys, time
method, corpus, output, model, onnx_dir, rows_per_shard = sys.argv[1:7]
import torch, sentence_transformers  # the libraries, imported before the clock starts
if method.startswith("ray"):
    import ray
from moe_embed.training.embed import EmbedOptions, embed_corpus, peak_rss_mib
texts = [json.loads(line)["text"] for line in open(corpus)]
if method.startswith("ray-") and method != "ray":
    ray.init(include_dashboard=False, log_to_driver=False, logging_level="WARNING")
start = time.perf_counter()
if method in ("encode", "pool"):
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(model, device="cpu")
    if method == "encode":
        called = time.perf_counter()
        vectors = st.encode(texts, batch_size=64)
        model_seconds = time.perf_counter() - called
    else:
        pool = st.start_multi_process_pool(["cpu"] * torch.get_num_threads())
        vectors = st.encode(texts, batch_size=64, pool=pool)
        st.stop_multi_process_pool(pool)
        model_seconds = None
    assert len(vectors) == len(texts)
else:
    settings = {"ray-2x1": {"actors": 2, "cpus_per_actor": 1}}.get(method, {})
    if method == "ray-int8":
        model, settings = onnx_dir, {"onnx_file": "onnx/model_qint8_avx512_vnni.onnx"}
    options = EmbedOptions(model, corpus, output, batch_size=64, rows_per_shard=int(rows_per_shard), **settings)
    report = embed_corpus(options)
    assert report.embedded == len(texts)
    model_seconds = None
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "driver_mib": peak_rss_mib(), "model_seconds": model_seconds}))
"""


# The id check alone on `rows` random hashes: prints {"seconds", "peak_mib", "start_mib", "repeated"}.
ID_CHECK = r"""
import json, sys, time
import numpy as np
from moe_embed.training.embed import ID_CHECK_MIB, peak_rss_mib, repeated_hashes
rows, batch = int(sys.argv[1]), 1_000_000
start_mib = peak_rss_mib()
def batches():
    rng = np.random.default_rng(0)
    for first in range(0, rows, batch):
        yield rng.integers(0, 2**64 - 1, size=min(batch, rows - first), dtype=np.uint64)
started = time.perf_counter()
repeated = repeated_hashes(batches(), rows, ID_CHECK_MIB)
seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_mib": peak_rss_mib(), "start_mib": start_mib, "repeated": len(repeated)}))
"""


def id_check(rows: int) -> dict:
    done = subprocess.run([sys.executable, "-c", ID_CHECK, str(rows)], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"the id check failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def corpus_texts(count: int, seed: int = 0, words: tuple[int, int] = (8, 24)) -> list[str]:
    """`count` texts of `words` words (8 to 24 by default: short texts) recombined from the sentences the package
    ships, seeded."""
    from moe_embed.convert.openvino_int8 import CALIBRATION_TEXTS

    vocabulary = CALIBRATION_TEXTS.read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    return [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(*words))) for _ in range(count)]


def write_corpus(path: Path, count: int, words: tuple[int, int] = (8, 24)) -> Path:
    texts = corpus_texts(count, words=words)
    path.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)))
    return path


def run_method(method: str, corpus: Path, work: Path, model: str, onnx_dir: Path, rows_per_shard: int = 10_000):
    """One method's `{"seconds", "driver_mib", "worker_mib", "model_seconds", "wall"}` (`wall`: the process's whole
    life; an embed job's worker memory and model seconds from its shards' summaries), in a fresh process; `cli` is
    `moe-embed embed` as a command (its `seconds` are its `wall`)."""
    output = work / f"out-{method}"
    if method == "cli":
        command = [sys.executable, "-m", "moe_embed.training.embed", model, str(corpus), "--output", str(output)]
        command += ["--batch-size", "64", "--rows-per-shard", str(rows_per_shard)]
    else:
        command = [sys.executable, "-c", RUN, method, str(corpus), str(output), model, str(onnx_dir)]
        command.append(str(rows_per_shard))
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{method} failed:\n{done.stderr[-3000:]}")
    shards = [json.loads(p.read_text()) for p in output.glob("_part-*.json")]  # an embed job's, each shard's summary
    shutil.rmtree(output, ignore_errors=True)
    result = {"seconds": wall} if method == "cli" else json.loads(done.stdout.strip().splitlines()[-1])
    result["worker_mib"] = max((shard["peak_rss_mib"] for shard in shards), default=0.0)
    if shards:
        result["model_seconds"] = sum(shard["embed_seconds"] for shard in shards)
    return {**result, "wall": wall}


def rows_per_second(rate: float) -> str:
    """A rate as the tables print it: whole rows/s, two significant digits below 10 (a slow machine's tiny
    corpus still shows what it measured, not 0)."""
    return f"{rate:.0f}" if rate >= 10 else f"{rate:.2g}"


def best_of(rate: dict) -> float:
    """The better rate of Sentence-Transformers' two ways (`encode`, its pool), of those measured."""
    return max(rate.get("encode", 0), rate.get("pool", 0)) or nan


def export_int8(work: Path, model: str) -> Path:
    from moe_embed.convert.export_onnx import ExportOptions, export_onnx

    return export_onnx(ExportOptions(model_dir=model, output=work / "minilm-onnx", quantize="int8"))


def main(argv: list[str] | None = None) -> None:
    parser = add_base_option(command_parser(__doc__.split("\n\n")[0]))
    parser.add_argument("--sizes", default="10000,50000", help="comma-separated corpus sizes (rows)")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds per size (default: %(default)s)")
    parser.add_argument("--memory-sizes", default="10000,100000", help="two sizes 10x apart for the memory rows")
    parser.add_argument(
        "--memory-rows-per-shard", type=int, default=1000, help="shard size of the memory rows (full shards at both)"
    )
    parser.add_argument("--id-check-sizes", default="", help="comma-separated hash counts for the id check's rows")
    args = parse(parser, argv)
    methods = args.methods.split(",")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        parser.error(f"unknown --methods {unknown}; expected names from {', '.join(METHODS)}")
    model = dense_base(args)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        onnx_dir = export_int8(work, model) if "ray-int8" in methods and args.sizes else work
        print(f"{cpu_description()}; median of {args.rounds} interleaved rounds, each method in a fresh process")
        timed = [m for m in methods if m != "cli"]  # clocked after their imports; `cli` has only a wall time
        shell = [m for m in ("encode", "pool", "cli") if m in methods]
        if args.sizes and timed:
            header = " | ".join(f"{m} (rows/s)" for m in timed)
            print(f"| rows | {header} | ray / best ST | ray-int8 / ray-running |")
            print("|---:|" + "---:|" * (len(timed) + 2))
        shell_rows, model_rows = [], []
        for size in [int(s) for s in args.sizes.split(",") if s]:
            corpus = write_corpus(work / f"corpus-{size}.jsonl", size)
            runs = {m: [] for m in methods}
            for _ in range(args.rounds):
                for method in methods:
                    runs[method].append(run_method(method, corpus, work, model, onnx_dir))
            rate = {m: size / statistics.median(r["seconds"] for r in runs[m]) for m in timed}
            if timed:
                cells = " | ".join(rows_per_second(rate[m]) for m in timed)
                ratios = rate.get("ray", nan) / best_of(rate), rate.get("ray-int8", nan) / rate.get("ray-running", nan)
                print(f"| {size} | {cells} | {ratios[0]:.2f} | {ratios[1]:.2f} |", flush=True)
            wall = {m: size / statistics.median(r["wall"] for r in runs[m]) for m in shell}
            cells = " | ".join(rows_per_second(wall[m]) for m in shell)
            shell_rows.append(f"| {size} | {cells} | {wall.get('cli', nan) / best_of(wall):.2f} |")
            called = [m for m in methods if runs[m][0].get("model_seconds") is not None]
            calls = {m: size / statistics.median(r["model_seconds"] for r in runs[m]) for m in called}
            model_rows.append((called, size, calls))
        if shell_rows and "cli" in shell:
            print("\nFrom a shell: the process's start to its exit, imports included (`cli`: `moe-embed embed`)")
            print("| rows | " + " | ".join(f"{m} (rows/s)" for m in shell) + " | cli / best ST |")
            print("|---:|" + "---:|" * (len(shell) + 1))
            print("\n".join(shell_rows), flush=True)
        for called, size, calls in model_rows:  # where the per-row part of the gap is: the model's calls
            print(f"\nThe model's calls alone at {size} rows (`encode`'s call; `embed`'s shards' `embed_seconds`):")
            print("| " + " | ".join(f"{m} (rows/s)" for m in called) + " |")
            print("|" + "---:|" * len(called))
            print("| " + " | ".join(rows_per_second(calls[m]) for m in called) + " |", flush=True)
        if args.memory_sizes:
            print("\n| rows | ray-running (rows/s) | driver peak (MiB) | worker peak (MiB) |")
            print("|---:|---:|---:|---:|")
            for size in [int(s) for s in args.memory_sizes.split(",")]:
                corpus = write_corpus(work / f"memory-{size}.jsonl", size)
                result = run_method("ray-running", corpus, work, model, onnx_dir, args.memory_rows_per_shard)
                print(
                    f"| {size} | {rows_per_second(size / result['seconds'])} | {result['driver_mib']:.0f} | "
                    f"{result['worker_mib']:.0f} |",
                    flush=True,
                )
        if args.id_check_sizes:
            print("\nThe final id check alone (random 64-bit hashes, a million a batch):")
            print("| ids | seconds | process peak (MiB) | at its start (MiB) |")
            print("|---:|---:|---:|---:|")
            for size in [int(s) for s in args.id_check_sizes.split(",")]:
                result = id_check(size)
                print(
                    f"| {size} | {result['seconds']:.1f} | {result['peak_mib']:.0f} | {result['start_mib']:.0f} |",
                    flush=True,
                )


if __name__ == "__main__":
    run_cli(main)
