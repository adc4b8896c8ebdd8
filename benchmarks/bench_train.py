"""Training throughput and peak memory of dense vs MoTE on the same batches, in one run.

    python -m benchmarks.bench_train                       # batch 32, 64 tokens, 5 rounds of 4 steps
    python -m benchmarks.bench_train --batch-size 64 --seq-len 128 --repeats 3

Both models start from the bundled all-MiniLM-L6-v2: the dense model with MoTE's prompts (the
instruction-conditioned baseline) and MoTE upcycled from it. A step is what TA-CL does per batch:
`MultipleNegativesRankingLoss` (τ of the task) forward and backward over (anchor, positive,
negative) columns of real training pairs and an AdamW step. Steps cycle through the retrieval
(query / document prefixes), classification and clustering tasks, one task per batch; both models
see the same pre-tokenised batches. Timing alternates the models in rounds (median steps/s and the
ratio MoTE/dense; target >= 0.95). Peak memory: each model trains the same steps in a fresh
process, which reports its peak resident memory above what the libraries take (VmHWM minus VmRSS
after the imports).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import BASE_HELP
from moe_embed.errors import UsageError, run_cli
from moe_embed.modeling.defaults import prompt_key
from moe_embed.options import command_parser, parse

REPO = Path(__file__).resolve().parent.parent
# the default rows: the SNLI triplets of the shared data folder beside the repository (its README describes them)
SHARED_PAIRS = "training_pairs/snli_devtest_triplets.jsonl"

TASK_STEPS = [
    ("retrieval", "query", "document", 0.03),
    ("classification", "classification", "classification", 0.03),
    ("clustering", "clustering", "clustering", 0.06),
]


def default_pairs() -> Path:
    """The shared SNLI triplets: in `$MOE_EMBED_SHARED`, else in `../shared/data` beside the repository."""
    shared = Path(os.environ.get("MOE_EMBED_SHARED") or REPO.parent / "shared" / "data")
    if not shared.is_dir():
        raise UsageError(
            f"no --pairs given and no shared data folder {shared} ($MOE_EMBED_SHARED, else ../shared/data beside "
            "the repository); pass --pairs FILE.jsonl with anchor, positive and negative"
        )
    return shared / SHARED_PAIRS


def load_rows(pairs: str | None, limit: int = 4096) -> list[dict]:
    """(anchor, positive, negative) rows of `pairs` (JSONL), by default the shared SNLI triplets."""
    from moe_embed.readers import read_jsonl

    path = Path(pairs) if pairs else default_pairs()
    rows = read_jsonl(path)[:limit]
    if not rows or any(not {"anchor", "positive", "negative"} <= set(row) for row in rows):
        raise UsageError(f"{path}: expected JSONL rows with anchor, positive and negative")
    return rows


def batches(model, rows: list[dict], batch_size: int, steps: int) -> list[tuple[list[dict], float]]:
    """Per step: tokenised (anchor, positive, negative) features with the step's task prompts, and τ."""
    prompts = model.prompts
    result = []
    for step in range(steps):
        _, anchor_prompt, other_prompt, tau = TASK_STEPS[step % len(TASK_STEPS)]
        chunk = [rows[(step * batch_size + i) % len(rows)] for i in range(batch_size)]
        columns = [(anchor_prompt, "anchor"), (other_prompt, "positive"), (other_prompt, "negative")]
        result.append(([model.tokenize([prompts[prompt_key(p)] + row[c] for row in chunk]) for p, c in columns], tau))
    return result


def make_trainer(model):
    """A closure running one training step on (features, τ)."""
    import torch
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    model.train()
    losses = {tau: MultipleNegativesRankingLoss(model, scale=1 / tau) for _, _, _, tau in TASK_STEPS}
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

    def step(features: list[dict], tau: float) -> None:
        loss = losses[tau]([dict(f) for f in features], None)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def load(folder: str, seq_len: int, threads: int | None):
    import torch
    from sentence_transformers import SentenceTransformer

    if threads:
        torch.set_num_threads(threads)
    model = SentenceTransformer(folder, trust_remote_code=True)
    model.max_seq_length = seq_len
    return model


def worker(folder: str, options: dict) -> None:
    """Train `steps` steps in this fresh process; print its peak memory above the libraries' as JSON."""
    import sentence_transformers  # noqa: F401
    import torch  # noqa: F401  (imported before the baseline so that library memory is not counted)

    from benchmarks.bench_memory import resident_kb

    before = resident_kb("VmRSS")
    model = load(folder, options["seq_len"], options["threads"])
    step = make_trainer(model)
    for features, tau in batches(model, load_rows(options["pairs"]), options["batch_size"], options["steps"]):
        step(features, tau)
    print(json.dumps({"peak_mb": (resident_kb("VmHWM") - before) / 1024}))


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__)
    parser.add_argument("--batch-size", type=int, default=32, help="rows per column per step (default 32)")
    parser.add_argument("--seq-len", type=int, default=64, help="max tokens per text (default 64)")
    parser.add_argument("--steps", type=int, default=4, help="steps per timing round (default 4)")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timing rounds (default 5)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument(
        "--pairs", default=None, help="JSONL with anchor/positive/negative (default: shared SNLI triplets)"
    )
    parser.add_argument("--base", default=None, help=BASE_HELP)
    parser.add_argument("--worker", nargs=2, metavar=("FOLDER", "OPTIONS_JSON"), help=argparse.SUPPRESS)
    args = parse(parser, argv)
    if args.worker:
        return worker(args.worker[0], json.loads(args.worker[1]))
    if min(args.batch_size, args.seq_len, args.steps, args.repeats) < 1:
        parser.error("--batch-size, --seq-len, --steps and --repeats must be positive")
    try:
        rows = load_rows(args.pairs)
    except UsageError as error:
        parser.error(str(error))

    from moe_embed.convert.instruction_baseline import save_dense_with_prompts
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    with tempfile.TemporaryDirectory() as tmp:
        dense_dir, mote_dir = str(Path(tmp) / "dense"), str(Path(tmp) / "mote")
        upcycle(upcycle_options(output=mote_dir, base=args.base, verify=False))
        save_dense_with_prompts(mote_dir, dense_dir, base=args.base)
        folders = {"dense + prompts": dense_dir, "MoTE": mote_dir}
        options = {
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "steps": args.steps * 3,
            "threads": args.threads,
            "pairs": args.pairs,
        }
        peaks = {
            name: json.loads(
                subprocess.run(
                    [sys.executable, "-m", "benchmarks.bench_train", "--worker", folder, json.dumps(options)],
                    capture_output=True,
                    text=True,
                    check=True,
                    cwd=REPO,  # benchmarks/ is not installed: run from the repository root
                ).stdout.splitlines()[-1]
            )["peak_mb"]
            for name, folder in folders.items()
        }
        models = {name: load(folder, args.seq_len, args.threads) for name, folder in folders.items()}
        work = {name: batches(model, rows, args.batch_size, args.steps) for name, model in models.items()}
        steppers = {name: make_trainer(model) for name, model in models.items()}
        for name in models:  # warm-up: one step of each task
            for features, tau in batches(models[name], rows, args.batch_size, len(TASK_STEPS)):
                steppers[name](features, tau)
        rates = {name: [] for name in models}
        for round_ in range(args.repeats):
            for name in list(models)[:: 1 if round_ % 2 == 0 else -1]:  # alternate who goes first
                start = time.perf_counter()
                for features, tau in work[name]:
                    steppers[name](features, tau)
                rates[name].append(args.steps / (time.perf_counter() - start))

    import torch

    dense, mote = (statistics.median(rates[name]) for name in folders)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32; batch {args.batch_size} x 3 columns, "
        f"{args.seq_len} tokens; median of {args.repeats} rounds of {args.steps} steps"
    )
    print("| model | steps/s | x dense | peak memory added MB | x dense |\n|---|---:|---:|---:|---:|")
    for name, rate in (("dense + prompts", dense), ("MoTE", mote)):
        print(
            f"| {name} | {rate:.3f} | {rate / dense:.3f} | {peaks[name]:.0f} "
            f"| {peaks[name] / peaks['dense + prompts']:.2f} |"
        )


if __name__ == "__main__":
    run_cli(main)
