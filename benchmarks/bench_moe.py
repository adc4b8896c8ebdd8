"""Encode throughput of a dense base (the bundled MiniLM unless `--base`) against the upcycled token-routed MoE, in
the same run.

    python -m benchmarks.bench_moe                       # batch 1, 32, 128 x 16 and 256 tokens
    python -m benchmarks.bench_moe --batch-sizes 32 --seq-lens 16 --repeats 3

The MoE is the base upcycled with the converter's defaults for `--arch moe` (8 experts,
top-2, every other layer, normal router init). For each shape the script times forward passes
(no grad, fp32) of the base in transformers' own class and of the MoE under each experts
implementation, in interleaved rounds, and prints the median sequences/s, the measured ratio
MoE/dense and the FLOP-bound ratio computed from the shapes (dense FLOPs / MoE FLOPs: what the
ratio would be if both ran at the same FLOP rate). Target: the best implementation within 10% of
the FLOP bound at batch >= 32. `batched_mm` gathers one weight matrix per routed token, so it is
skipped where that would need more than `--batched-mm-max-gb` of memory.
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
from moe_embed.modeling.modeling_moe import MoeBertModel
from moe_embed.options import parse

IMPLEMENTATIONS = ["eager", "grouped_mm", "batched_mm"]


def layer_flops(config, seq_len: int, ffn_multiplier: float, router: bool) -> float:
    """Multiply-add FLOPs per token of one encoder layer (x2 for multiply and add)."""
    h, i = config.hidden_size, config.intermediate_size
    attention = 4 * h * h + 2 * seq_len * h  # q, k, v, o projections; scores and weighted sum
    ffn = (3 if config.gated_mlp else 2) * h * i * ffn_multiplier  # a gated block's first projection is 2I wide
    return 2 * (attention + ffn + (h * config.num_local_experts if router else 0))


def flop_bound_ratio(config, seq_len: int) -> float:
    """Dense FLOPs / MoE FLOPs per token for `config` at `seq_len` tokens."""
    dense = config.num_hidden_layers * layer_flops(config, seq_len, 1, False)
    moe_layers = len(config.moe_layers)
    moe = (config.num_hidden_layers - moe_layers) * layer_flops(config, seq_len, 1, False)
    moe += moe_layers * layer_flops(config, seq_len, config.num_experts_per_tok, True)
    return dense / moe


def batched_mm_gigabytes(config, tokens: int) -> float:
    """Memory batched_mm needs for the weights it gathers per routed token (fp32)."""
    per_slot = 2 * config.hidden_size * config.intermediate_size * 4
    return tokens * config.num_experts_per_tok * per_slot / 1e9


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__, "an upcycled MoE folder (default: upcycle the bundled MiniLM)")
    parser.add_argument("--batched-mm-max-gb", type=float, default=2.0, help="skip batched_mm above this memory")
    args = parse(parser, argv)

    dense = load_dense(dense_base(args))
    attention = attention_of(dense)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            folder = str(Path(tmp) / "moe")
            upcycle(upcycle_options(output=folder, base=args.base, arch="moe"))
        moe = MoeBertModel.from_pretrained(folder, attn_implementation=attention).eval()
    config = moe.config

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, {type(dense).__name__} and the MoE "
        f"with {attention} attention; "
        f"{config.num_local_experts} experts, "
        f"top-{config.num_experts_per_tok}, MoE layers {config.moe_layers}; median of {args.repeats} rounds"
    )
    header = " | ".join(f"{name} seq/s (ratio)" for name in IMPLEMENTATIONS)
    print(f"| batch | tokens | dense seq/s | {header} | FLOP-bound ratio | best / bound |")
    print("|---:|---:|---:|" + "---:|" * len(IMPLEMENTATIONS) + "---:|---:|")
    generator = torch.Generator().manual_seed(0)
    for batch_size, seq_len in tqdm(prepare(args), desc="shapes", file=sys.stderr):
        input_ids = random_ids(min(config.vocab_size, dense.config.vocab_size), batch_size, seq_len, generator)
        batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        runnable = [
            i
            for i in IMPLEMENTATIONS
            if i != "batched_mm" or batched_mm_gigabytes(config, batch_size * seq_len) <= args.batched_mm_max_gb
        ]
        runs = {name: [] for name in ["dense", *runnable]}
        for name in runs:  # warm-up
            if name != "dense":
                moe.set_experts_implementation(name)
            time_forward(dense if name == "dense" else moe, batch, 0.05)
        for _ in range(args.repeats):
            for name in runs:
                if name != "dense":
                    moe.set_experts_implementation(name)
                runs[name].append(time_forward(dense if name == "dense" else moe, batch, args.min_time))
        med = {name: statistics.median(values) for name, values in runs.items()}
        bound = flop_bound_ratio(config, seq_len)
        cells = []
        for name in IMPLEMENTATIONS:
            if name in med:
                cells.append(f"{med[name]:.1f} ({med[name] / med['dense']:.3f})")
            else:
                cells.append(f"skipped ({batched_mm_gigabytes(config, batch_size * seq_len):.0f} GB)")
        best = max(med[name] for name in runnable) / med["dense"]
        print(
            f"| {batch_size} | {seq_len} | {med['dense']:.1f} | "
            + " | ".join(cells)
            + f" | {bound:.3f} | {best / bound:.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    run_cli(main)
