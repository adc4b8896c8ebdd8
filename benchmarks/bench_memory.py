"""Peak memory and load time of dense / MoTE all tasks / MoTE one task / Expert Averaging, in one run.

    python -m benchmarks.bench_memory
    python -m benchmarks.bench_memory --repeats 5 --texts 256

Each variant is loaded with `SentenceTransformer` in its own fresh process (so peaks do not mix),
which then encodes the same texts with the `query` prompt. The process reports the parameter
bytes, the load time, and its resident memory: the peak (VmHWM) minus the resident memory after
importing the libraries, i.e. what loading and running the model added. Variants run in
interleaved rounds; the table shows medians. Then the dense model and the EA export are timed
against each other in one process (interleaved encode rounds) for the throughput ratio.
Targets: MoTE one task <= 1.05x dense memory; EA encode throughput within noise of dense.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

REPO = Path(__file__).resolve().parent.parent

TEXTS = [f"Sentence number {i} about search, embeddings and mixtures of task experts." for i in range(1024)]


def resident_kb(field: str) -> int:
    """`VmRSS` or `VmHWM` of this process from /proc, in kB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def worker(folder: str, kwargs: dict, num_texts: int) -> None:
    """Load one variant, encode, print a JSON line with its measurements."""
    import torch  # noqa: F401  (imported before the baseline so that library memory is not counted)
    import transformers  # noqa: F401
    from sentence_transformers import SentenceTransformer

    before = resident_kb("VmRSS")
    start = time.perf_counter()
    model = SentenceTransformer(folder, **kwargs)
    load_s = time.perf_counter() - start
    model.encode(TEXTS[:num_texts], prompt_name="query", batch_size=32)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    print(json.dumps({"load_s": load_s, "param_mb": params / 2**20, "peak_mb": (resident_kb("VmHWM") - before) / 1024}))


def throughput(dense_path: str, ea_path: str, repeats: int, num_texts: int) -> tuple[float, float]:
    """Median texts/s of the dense model and the EA export, timed in interleaved rounds."""
    from sentence_transformers import SentenceTransformer

    models = {"dense": SentenceTransformer(dense_path), "ea": SentenceTransformer(ea_path)}
    rates = {name: [] for name in models}
    for model in models.values():
        model.encode(TEXTS[:32], prompt_name=None, prompt="search_query: ")  # warm-up
    for round_ in range(repeats):
        for name, model in list(models.items())[:: 1 if round_ % 2 == 0 else -1]:  # alternate who goes first
            start = time.perf_counter()
            model.encode(TEXTS[:num_texts], prompt="search_query: ", batch_size=32)
            rates[name].append(num_texts / (time.perf_counter() - start))
    return statistics.median(rates["dense"]), statistics.median(rates["ea"])


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds (fresh processes) per variant")
    parser.add_argument("--texts", type=int, default=256, help="texts encoded per measurement")
    parser.add_argument("--worker", nargs=3, metavar=("FOLDER", "KWARGS_JSON", "TEXTS"), help=argparse.SUPPRESS)
    args = parse(parser, argv)
    if args.worker:
        folder, kwargs, num_texts = args.worker
        return worker(folder, json.loads(kwargs), int(num_texts))

    from moe_embed.convert.merge_experts import MergeOptions, merge
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle
    from moe_embed.folders import bundled_minilm_path

    dense = bundled_minilm_path()
    with tempfile.TemporaryDirectory() as tmp:
        mote, ea = str(Path(tmp) / "mote"), str(Path(tmp) / "ea")
        upcycle(upcycle_options(output=mote, verify=False))
        merge(MergeOptions(model_dir=mote, output=ea))
        variants = {
            "dense (all-MiniLM-L6-v2)": (dense, {}),
            "MoTE, all 4 tasks": (mote, {"trust_remote_code": True}),
            "MoTE, active_tasks=['query']": (
                mote,
                {"trust_remote_code": True, "model_kwargs": {"active_tasks": ["query"]}},
            ),
            "Expert Averaging (plain BertModel)": (ea, {}),
        }
        results = {name: [] for name in variants}
        for round_ in range(args.repeats):
            for name, (folder, kwargs) in list(variants.items())[:: 1 if round_ % 2 == 0 else -1]:
                out = subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "benchmarks.bench_memory",
                        "--worker",
                        folder,
                        json.dumps(kwargs),
                        str(args.texts),
                    ],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=REPO,  # benchmarks/ is not installed: run from the repository root
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        dense_rate, ea_rate = throughput(dense, ea, args.repeats * 2, args.texts)

    base = statistics.median(r["peak_mb"] for r in results["dense (all-MiniLM-L6-v2)"])
    base_params = results["dense (all-MiniLM-L6-v2)"][0]["param_mb"]
    print(f"median of {args.repeats} fresh processes each; {args.texts} texts encoded with the query prompt, batch 32")
    print("| variant | parameters MB | x dense | peak memory added MB | x dense | load s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, runs in results.items():
        peak = statistics.median(r["peak_mb"] for r in runs)
        load = statistics.median(r["load_s"] for r in runs)
        params = runs[0]["param_mb"]
        print(f"| {name} | {params:.1f} | {params / base_params:.2f} | {peak:.1f} | {peak / base:.2f} | {load:.2f} |")
    print(
        f"\nencode throughput (texts/s, median of {args.repeats * 2} interleaved rounds): dense {dense_rate:.1f}, "
        f"EA {ea_rate:.1f}, ratio EA/dense {ea_rate / dense_rate:.3f}"
    )


if __name__ == "__main__":
    run_cli(main)
