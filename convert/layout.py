"""The checkpoint key layout of every model type, in one place.

A dense checkpoint, once its keys are the shared encoder's (every base is renamed into BERT's names by
`convert/bases.py`), and this package's models share every key except those of the feed-forward blocks a model
type replaces. This file says, once, which dense keys become which expert keys and back, so that upcycling
(`convert/builders.py`), merging (`convert/merge_experts.py`) and model cards (`convert/cards.py`) cannot disagree:

    dense                                          MoTE (expert e of layer N)
    encoder.layer.N.attention.output.LayerNorm.*   encoder.layer.N.experts.e.attention_LayerNorm.*   (post-LN)
    encoder.layer.N.feed_forward_norm.*            encoder.layer.N.experts.e.feed_forward_norm.*     (pre-norm)
    encoder.layer.N.intermediate.dense.*           encoder.layer.N.experts.e.intermediate.dense.*
    encoder.layer.N.output.dense.*                 encoder.layer.N.experts.e.output.dense.*
    encoder.layer.N.output.LayerNorm.*             encoder.layer.N.experts.e.output.LayerNorm.*      (post-LN)

    dense                                          token-routed MoE (stacked over experts, dim 0)
    encoder.layer.N.intermediate.dense.weight      encoder.layer.N.mlp.experts.up_proj
    encoder.layer.N.intermediate.dense.bias        encoder.layer.N.mlp.experts.up_proj_bias
    encoder.layer.N.output.dense.weight            encoder.layer.N.mlp.experts.down_proj
    encoder.layer.N.output.dense.bias              encoder.layer.N.mlp.experts.down_proj_bias
    (new)                                          encoder.layer.N.mlp.router.weight
    a gated block (no biases): intermediate.dense.weight (2I, H) -> mlp.experts.gate_up_proj (E, 2I, H)

    dense                                          CoMoE (linear L = encoder.layer.N.<target module>)
    L.weight, L.bias                               L.weight, L.bias (unchanged, frozen)
    (new)                                          L.lora_A (E, r, in), L.lora_B (E, out, r), L.router.weight (E, in)
"""

from __future__ import annotations

import re

import torch

from moe_embed.errors import UsageError
from moe_embed.modeling.comoe_layer import is_adapter_key

# dense module of layer N -> its name inside a MoTE expert
MOTE_EXPERT_PARTS = {
    "attention.output.LayerNorm": "attention_LayerNorm",
    "feed_forward_norm": "feed_forward_norm",  # a pre-norm layer's (ModernBERT)
    "intermediate": "intermediate",
    "output": "output",
}
_MOTE_DENSE_PARTS = {inner: dense for dense, inner in MOTE_EXPERT_PARTS.items()}
_DENSE_EXPERT_KEY = re.compile(
    r"^encoder\.layer\.(\d+)\.(attention\.output\.LayerNorm|feed_forward_norm|intermediate|output)\.(.+)$"
)
_MOTE_EXPERT_KEY = re.compile(r"^encoder\.layer\.(\d+)\.experts\.(\d+)\.([A-Za-z_]+)\.(.+)$")

# dense tensor of layer N -> the stacked parameter of its token-routed MoE block
MOE_STACKED = {
    "intermediate.dense.weight": "up_proj",
    "intermediate.dense.bias": "up_proj_bias",
    "output.dense.weight": "down_proj",
    "output.dense.bias": "down_proj_bias",
}
# a gated feed-forward block (ModernBERT's GLU, no biases): its doubled first projection is `gate_up_proj`
MOE_GATED_STACKED = {"intermediate.dense.weight": "gate_up_proj", "output.dense.weight": "down_proj"}
MOE_DENSE = {stacked: dense for table in (MOE_STACKED, MOE_GATED_STACKED) for dense, stacked in table.items()}
_DENSE_FFN_KEY = re.compile(r"^encoder\.layer\.(\d+)\.((?:intermediate|output)\.dense\.(?:weight|bias))$")
_MOE_KEY = re.compile(r"^encoder\.layer\.(\d+)\.mlp\.(?:experts\.(\w+)|(router)\.weight)$")


def mote_expert_key(dense_key: str) -> tuple[int, str] | None:
    """`(layer, key inside an expert)` for a dense key that MoTE moves into its experts, else `None`."""
    match = _DENSE_EXPERT_KEY.match(dense_key)
    if match is None:
        return None
    layer, part, rest = match.groups()
    return int(layer), f"{MOTE_EXPERT_PARTS[part]}.{rest}"


def mote_key(layer: int, expert: int, key_in_expert: str) -> str:
    """Key of `key_in_expert` in expert `expert` of MoTE layer `layer`."""
    return f"encoder.layer.{layer}.experts.{expert}.{key_in_expert}"


def parse_mote_key(key: str) -> tuple[int, int, str] | None:
    """`(layer, expert, dense key)` for a MoTE expert key, else `None`.

    Raises:
        UsageError: for an expert key whose part is not one of `MOTE_EXPERT_PARTS` (a foreign checkpoint).
    """
    match = _MOTE_EXPERT_KEY.match(key)
    if match is None:
        return None
    layer, expert, part, rest = match.groups()
    if part not in _MOTE_DENSE_PARTS:
        raise UsageError(f"unexpected expert tensor {key}: expected parts {sorted(_MOTE_DENSE_PARTS)}")
    return int(layer), int(expert), f"encoder.layer.{layer}.{_MOTE_DENSE_PARTS[part]}.{rest}"


def moe_stacked_key(dense_key: str, gated: bool = False) -> tuple[int, str] | None:
    """`(layer, stacked key)` for a dense FFN projection that a token-routed MoE stacks (of a gated block where
    `gated`), else `None`."""
    match = _DENSE_FFN_KEY.match(dense_key)
    if match is None:
        return None
    layer = int(match.group(1))
    stacked = (MOE_GATED_STACKED if gated else MOE_STACKED)[match.group(2)]
    return layer, f"encoder.layer.{layer}.mlp.experts.{stacked}"


def moe_router_key(layer: int) -> str:
    """Key of the router weight of MoE layer `layer`."""
    return f"encoder.layer.{layer}.mlp.router.weight"


def parse_moe_key(key: str) -> tuple[int, str | None] | None:
    """For a token-routed MoE key: `(layer, dense key)` of a stacked expert parameter, `(layer, None)`
    for a router weight; `None` for every key the dense model shares."""
    match = _MOE_KEY.match(key)
    if match is None:
        return None
    layer = int(match.group(1))
    if match.group(3):
        return layer, None
    if match.group(2) not in MOE_DENSE:
        raise UsageError(f"unexpected expert tensor {key}: expected {sorted(MOE_DENSE)}")
    return layer, f"encoder.layer.{layer}.{MOE_DENSE[match.group(2)]}"


def mote_rename(expert_layers: set[int], num_tasks: int):
    """Dense key -> MoTE keys: expert parts of expert layers go to every expert, the rest is shared."""

    def rename(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        expert_key = mote_expert_key(key)
        if expert_key is None or expert_key[0] not in expert_layers:
            return [(key, tensor)]
        layer, inner = expert_key
        # Each expert gets its own copy: tensors must not share memory in safetensors.
        return [(mote_key(layer, e, inner), tensor.clone()) for e in range(num_tasks)]

    return rename


def moe_rename(
    moe_layers: set[int], num_experts: int, noise_std: float, generator: torch.Generator, gated: bool = False
):
    """Dense key -> token-routed MoE keys: FFN projections of MoE layers (of a gated block where `gated`) are
    stacked once per expert, with Gaussian noise of std `noise_std` on the weights when it is positive."""

    def rename(key: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        stacked_key = moe_stacked_key(key, gated)
        if stacked_key is None or stacked_key[0] not in moe_layers:
            return [(key, tensor)]
        stacked = tensor.unsqueeze(0).repeat(num_experts, *([1] * tensor.dim()))
        if noise_std > 0 and key.endswith(".weight"):
            stacked = stacked + noise_std * torch.randn(stacked.shape, generator=generator)
        return [(stacked_key[1], stacked)]

    return rename


def comoe_adapter_keys(linear: str) -> dict[str, str]:
    """Keys of the adapters a CoMoE model adds to the linear `linear`: `lora_A`, `lora_B`, `router`."""
    return {"lora_A": f"{linear}.lora_A", "lora_B": f"{linear}.lora_B", "router": f"{linear}.router.weight"}


def is_comoe_expert_key(key: str) -> bool:
    """Whether `key` is a CoMoE LoRA expert tensor (`lora_A` / `lora_B`, not a router)."""
    return is_adapter_key(key) and not key.endswith(".router.weight")


__all__ = [
    "MOTE_EXPERT_PARTS",
    "MOE_STACKED",
    "MOE_DENSE",
    "MOE_GATED_STACKED",
    "mote_expert_key",
    "mote_key",
    "mote_rename",
    "moe_rename",
    "parse_mote_key",
    "moe_stacked_key",
    "moe_router_key",
    "parse_moe_key",
    "comoe_adapter_keys",
    "is_comoe_expert_key",
]
