"""Encode throughput of AEA against the unmodified model, in the same run; and the calibration time.

    python -m benchmarks.bench_aea                       # batch 1, 32, 128 x 32 and 128 tokens
    python -m benchmarks.bench_aea --batch-sizes 32 --seq-lens 32 --repeats 3

Two models: the bundled MiniLM upcycled to the token-routed MoE as in `experiments.aea_moe_encoder`
(8 experts, top-2, every layer, expert noise 0.02 so that experts differ; `ENCODER`) and a small random OLMoE
(8 layers, hidden 512, 16 experts, top-4). For each shape the script times, in interleaved rounds,
the unmodified model on its default attention (sdpa) up to the default exit layer (L for the encoder,
L-1 for the decoder: the plain embedding, `--allocation none`), AEA up to the same layer with
layer-wise allocation (alpha 2) and token-wise allocation (floor, as in the paper), which needs
eager attention, and layer-wise allocation alone, which keeps sdpa. It prints the median
sequences/s and the ratio AEA / unmodified (target >= 0.90 at batch >= 32: the paper claims no added
time), and the (token, expert) pairs AEA computes per batch against the unmodified model's (the
floor rule spends less than the budget; an early exit moves the exited layers' budget to the kept
ones). The calibration time is `measure_homogeneity` on 1,000 texts of 32 tokens, per 1,000 texts.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModel

from benchmarks.common import prepare, random_ids, time_forward, timing_parser
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.errors import run_cli
from moe_embed.modeling.aea_allocation import allocate_layers
from moe_embed.modeling.aea_controller import AdaptiveExpertAllocation
from moe_embed.modeling.aea_homogeneity import measure_homogeneity
from moe_embed.modeling.aea_layers import experts_arguments, find_moe_layers
from moe_embed.options import parse

# the MoE encoder of experiments/aea_moe_encoder.py: every layer, 8 experts, top-2, experts that differ
ENCODER = {"arch": "moe", "moe_layers": "all", "num_local_experts": 8, "num_experts_per_tok": 2}
ENCODER.update(norm_topk_prob=True, expert_noise=0.02)

OLMOE = dict(
    vocab_size=32000,
    hidden_size=512,
    intermediate_size=256,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=8,
    num_experts=16,
    num_experts_per_tok=4,
    max_position_embeddings=512,
)


def moe_encoder(folder: Path, attention: str):
    return AutoModel.from_pretrained(str(folder), trust_remote_code=True, attn_implementation=attention).eval()


def small_olmoe(attention: str):
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model("olmoe", **OLMOE), attn_implementation=attention)
    return model.eval()


def calibration_batches(vocab_size: int, texts: int, seq_len: int, batch_size: int = 50):
    generator = torch.Generator().manual_seed(0)
    for start in range(0, texts, batch_size):
        ids = random_ids(vocab_size, min(batch_size, texts - start), seq_len, generator)
        yield ids, torch.ones_like(ids)


def controllers(eager_model, sdpa_model, exit_layer: int, texts: int):
    """`(calibration seconds, {name: controller})`: the unmodified model (its own k, same exit layer),
    AEA (layer- and token-wise, eager) and layer-wise only (sdpa)."""
    start = time.perf_counter()
    homogeneity = measure_homogeneity(sdpa_model, calibration_batches(sdpa_model.config.vocab_size, texts, 32))
    calibration_seconds = time.perf_counter() - start
    _, layers = find_moe_layers(sdpa_model)
    top_k = next(h.router.top_k for h in layers if h.router is not None)
    caps = [h.cap if h.router is not None else None for h in layers]
    layer_top_k, _ = allocate_layers(homogeneity, top_k, caps, alpha=2.0, exit_layer=exit_layer)
    own_top_k = [h.router.top_k if h.router is not None else None for h in layers]
    return calibration_seconds, {
        "unmodified": AdaptiveExpertAllocation(sdpa_model, own_top_k, exit_layer=exit_layer),
        "AEA": AdaptiveExpertAllocation(eager_model, layer_top_k, token_wise=True, exit_layer=exit_layer),
        "AEA layer-wise": AdaptiveExpertAllocation(sdpa_model, layer_top_k, exit_layer=exit_layer),
    }


@torch.inference_mode()
def expert_rows(controller, batch: dict) -> int:
    """(token, expert) pairs the experts compute in one call of `controller`: the expert work done."""

    count = [0]

    def hook(module, args, kwargs):  # registered after the controller's: sees what reaches the experts
        count[0] += experts_arguments(args, kwargs)[1].numel()

    with controller.apply():
        handles = [h.experts.register_forward_pre_hook(hook, with_kwargs=True) for h in controller.layers if h.experts]
        try:
            controller(**batch)
        finally:
            for handle in handles:
                handle.remove()
    return count[0]


def bench_model(name, sdpa_model, eager_model, exit_layer, shapes, args) -> list[str]:
    calibration_seconds, variants = controllers(eager_model, sdpa_model, exit_layer, args.calibration_texts)
    rows = []
    for batch_size, seq_len in tqdm(shapes, desc=name, unit="shape"):
        generator = torch.Generator().manual_seed(1)
        ids = random_ids(sdpa_model.config.vocab_size, batch_size, seq_len, generator)
        batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
        timings = {key: [] for key in variants}
        for _ in range(args.repeats):
            for key, controller in variants.items():
                with controller.apply():
                    timings[key].append(time_forward(controller, batch, args.min_time))
        base = statistics.median(timings["unmodified"])
        rows_ratio = expert_rows(variants["AEA"], batch) / expert_rows(variants["unmodified"], batch)
        cells = [
            f"{statistics.median(timings[key]):.1f} ({statistics.median(timings[key]) / base:.2f})"
            for key in variants
            if key != "unmodified"
        ]
        cells.append(f"{rows_ratio:.2f}")
        rows.append(f"| {name} | {batch_size} | {seq_len} | {base:.1f} | " + " | ".join(cells) + " |")
    per_1000 = calibration_seconds * 1000 / args.calibration_texts
    rows.append(f"| {name} | calibration | 32 | {per_1000:.1f} s per 1,000 texts | | | |")
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__.split("\n\n")[0], "ignored: the two models are built by the script (--base)")
    parser.set_defaults(seq_lens="32,128")
    parser.add_argument("--calibration-texts", type=int, default=1000, help="texts to time the calibration on")
    args = parse(parser, argv)
    shapes = prepare(args)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "moe"
        upcycle(upcycle_options(output=folder, base=args.base, **ENCODER))
        encoder = moe_encoder(folder, "sdpa")
        name = "MoE MiniLM" if args.base is None else f"MoE {Path(args.base).name}"
        layers = encoder.config.num_hidden_layers
        rows += bench_model(name, encoder, moe_encoder(folder, "eager"), layers, shapes, args)
    decoder = small_olmoe("sdpa")
    eager_decoder = small_olmoe("eager")
    eager_decoder.load_state_dict(decoder.state_dict())
    rows += bench_model("OLMoE 8x512", decoder, eager_decoder, OLMOE["num_hidden_layers"] - 1, shapes, args)
    print(
        "| model | batch | tokens | unmodified (seq/s) | AEA (seq/s, ratio) | AEA layer-wise (seq/s, ratio) "
        "| AEA expert rows / unmodified |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    run_cli(main)
