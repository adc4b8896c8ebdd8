"""CoMoE-PEFT against the dense MiniLM, in the same run: encode throughput of CoMoE and of its merged
export, training steps/s of CoMoE, MoE-LoRA, plain LoRA and full fine-tuning, trainable parameters.

    python -m benchmarks.bench_comoe                                  # batch 1, 32, 128 x 16 and 256 tokens
    python -m benchmarks.bench_comoe --batch-sizes 32 --seq-lens 16 --repeats 3 --train-steps 5

CoMoE is the bundled MiniLM upcycled with `--arch comoe` (4 experts, top-2, r 16, q/k/v/o in all
layers) with random `B` (as after training; B's values do not change the cost). Encode: forward
passes (no grad, fp32, sdpa) in interleaved rounds, median sequences/s, the measured ratio to
dense, and two FLOP-bound ratios from the shapes: `top-k` counts the chosen experts only (what a
gather-based kernel would do), `impl` what this implementation computes (every expert's rank-r
code, then gated codes times the stacked B). Target: CoMoE >= 0.85 of dense at batch >= 32, the
merged export at dense speed. Training: AdamW steps of an in-batch InfoNCE loss on mean-pooled
embeddings of `--train-batch` (anchor, positive) pairs of `--train-tokens` tokens each.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoModel

from benchmarks.common import dense_base, prepare, random_ids, time_forward, timing_parser
from moe_embed.convert.merging import dense_config
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.errors import run_cli
from moe_embed.modeling.modeling_comoe import CoMoeBertModel
from moe_embed.options import parse


def linear_shapes(config) -> list[tuple[int, int]]:
    """`(in, out)` of every adapted linear."""
    h, i = config.hidden_size, config.intermediate_size
    shape = {"intermediate.dense": (h, i), "output.dense": (i, h)}
    return [shape.get(name, (h, h)) for _ in config.adapter_layers for name in config.target_modules]


def dense_flops(config, seq_len: int) -> float:
    """Multiply-add FLOPs per token of the dense encoder (x2 for multiply and add)."""
    h, i = config.hidden_size, config.intermediate_size
    return 2 * config.num_hidden_layers * (4 * h * h + 2 * seq_len * h + 2 * h * i)


def flop_bound_ratio(config, seq_len: int, experts_computed: int) -> float:
    """Dense FLOPs / CoMoE FLOPs per token when `experts_computed` experts' LoRA products are computed."""
    extra = sum(
        2 * (config.num_local_experts * fan_in + experts_computed * config.lora_rank * (fan_in + fan_out))
        for fan_in, fan_out in linear_shapes(config)
    )
    base = dense_flops(config, seq_len)
    return base / (base + extra)


def train_steps_per_second(model, batch: dict, steps: int) -> float:
    """Optimizer steps/s of an in-batch InfoNCE loss (anchors = first half of the batch)."""
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    mask = batch["attention_mask"].unsqueeze(-1).float()
    half = batch["input_ids"].shape[0] // 2

    def step():
        out = model(**batch)
        pooled = torch.nn.functional.normalize((out.last_hidden_state * mask).sum(1) / mask.sum(1), dim=-1)
        scores = pooled[:half] @ pooled[half:].T / 0.05
        loss = torch.nn.functional.cross_entropy(scores, torch.arange(half))
        if getattr(out, "aux_loss", None) is not None:
            loss = loss + out.aux_loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # warm-up
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__, "an upcycled CoMoE folder (default: upcycle the bundled MiniLM)")
    parser.add_argument("--train-steps", type=int, default=10, help="timed optimizer steps per training variant")
    parser.add_argument("--train-batch", type=int, default=32, help="pairs per training batch")
    parser.add_argument("--train-tokens", type=int, default=64, help="tokens per training text")
    args = parse(parser, argv)

    dense = AutoModel.from_pretrained(dense_base(args), attn_implementation="sdpa").eval()
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or str(Path(tmp) / "comoe")
        if args.model is None:
            upcycle(upcycle_options(output=folder, base=args.base, arch="comoe"))
        comoe = CoMoeBertModel.from_pretrained(folder, attn_implementation="sdpa").eval()
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for name, param in comoe.named_parameters():
                if name.endswith("lora_B"):
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.01)
    # the merged export, built in memory as convert/merge_experts.py builds it (uniform expert weights)
    config = comoe.config
    shares = torch.full((len(config.adapted_linears()), config.num_local_experts), 1 / config.num_local_experts)
    merged = AutoModel.from_config(dense_config(config.to_dict()), attn_implementation="sdpa")
    merged.load_state_dict(comoe.merged_state_dict(shares))
    merged.eval()
    trainable, total = comoe.num_parameters_by_kind()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, fp32, sdpa; "
        f"{config.num_local_experts} experts, "
        f"top-{config.num_experts_per_tok}, r {config.lora_rank}, {len(linear_shapes(config))} linears; "
        f"median of {args.repeats} rounds"
    )
    print("| batch | tokens | dense seq/s | CoMoE seq/s (ratio) | merged seq/s (ratio) | FLOP bound top-k | impl |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    models = {"dense": dense, "comoe": comoe, "merged": merged}
    vocab_size = min(config.vocab_size, dense.config.vocab_size)
    for batch_size, seq_len in tqdm(prepare(args), desc="shapes", file=sys.stderr):
        input_ids = random_ids(vocab_size, batch_size, seq_len, generator)
        batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}
        runs = {name: [] for name in models}
        for model in models.values():
            time_forward(model, batch, 0.05)  # warm-up
        for _ in range(args.repeats):
            for name, model in models.items():
                runs[name].append(time_forward(model, batch, args.min_time))
        med = {name: statistics.median(values) for name, values in runs.items()}
        print(
            f"| {batch_size} | {seq_len} | {med['dense']:.1f} | {med['comoe']:.1f} ({med['comoe'] / med['dense']:.3f}) "
            f"| {med['merged']:.1f} ({med['merged'] / med['dense']:.3f}) "
            f"| {flop_bound_ratio(config, seq_len, config.num_experts_per_tok):.3f} "
            f"| {flop_bound_ratio(config, seq_len, config.num_local_experts):.3f} |",
            flush=True,
        )

    # training: the same batch for every variant
    ids = random_ids(vocab_size, 2 * args.train_batch, args.train_tokens, generator)
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    variants = {}
    variants["CoMoE (λ 0.01)"] = comoe
    lora_free = CoMoeBertModel(config.__class__.from_dict({**config.to_dict(), "contrastive_loss_coef": 0.0}))
    lora_free.load_state_dict(comoe.state_dict())
    variants["MoE-LoRA (λ 0)"] = lora_free
    from peft import LoraConfig, get_peft_model

    lora = get_peft_model(
        AutoModel.from_pretrained(dense_base(args), attn_implementation="sdpa"),
        LoraConfig(
            r=config.lora_rank,
            lora_alpha=config.lora_alpha,
            target_modules=["query", "key", "value", "attention.output.dense"],
        ),
    )
    variants[f"LoRA r {config.lora_rank}"] = lora
    variants["full fine-tuning"] = AutoModel.from_pretrained(dense_base(args), attn_implementation="sdpa")
    print(
        f"\ntraining: {2 * args.train_batch} texts x {args.train_tokens} tokens per step, AdamW, "
        f"{args.train_steps} steps"
    )
    print("| variant | trainable parameters | steps/s | vs full fine-tuning |")
    print("|---|---:|---:|---:|")
    rates = {name: train_steps_per_second(model, batch, args.train_steps) for name, model in variants.items()}
    for name, model in variants.items():
        count = sum(p.numel() for p in model.parameters() if p.requires_grad)
        print(f"| {name} | {count:,} | {rates[name]:.2f} | {rates[name] / rates['full fine-tuning']:.2f} |")
    print(f"\nCoMoE: {trainable:,} trainable of {total:,} parameters ({100 * trainable / total:.1f}%)")


if __name__ == "__main__":
    run_cli(main)
