"""AEA's allocation rules (Yang et al., "AEA: Adaptive Expert Allocation Improves Sentence Embeddings from
Mixture-of-Experts LLM"), pure functions of the homogeneity scores and the attention strengths:

- between layers (section 4.1): `k_l` from each layer's expert homogeneity `s_l`, fewer experts where
  experts agree, the budget of the layers after the exit layer reallocated to the kept ones;
- between tokens (section 4.2): token `i` of a sequence of `T` real tokens gets `k_i = floor(k_l · T · p_i)`
  experts, `p_i` its share of the strongest attention it receives.

Calibrated model folders carry this file inlined into their code: it imports only torch.
"""

import math

import torch

from .defaults import AEA_ROUNDINGS

# Floor of a token's share of the budget, with this tolerance: a share that is an integer in exact
# arithmetic (uniform attention gives exactly `k_l` each) must not lose an expert to rounding.
_FLOOR_TOLERANCE = 1e-4


def allocate_layers(
    homogeneity: list,
    top_k: int,
    caps: list,
    alpha: float = 1.0,
    shift: float = 1.0,
    exit_layer: int | None = None,
) -> tuple[list, int]:
    """Per-layer expert counts from homogeneity (paper section 4.1): `(layer_top_k, unspent)`.

    `homogeneity[l]` is `s_l` for an MoE layer and `None` for a dense one; `caps[l]` the most experts
    a token can get in layer `l`. The budget is `top_k ×` the number of MoE layers, all of them: the
    layers after `exit_layer` (a count, 1..L) get 0 and their budget goes to the kept ones. A kept
    layer's share is proportional to `max(shift − s_l, 0) ** alpha` (`shift` 1 is the paper's
    `(1 − s_l)^α`, 0.1 its shifted form for Qwen), kept within [1, cap]: a layer that would get less
    than 1 or more than its cap is fixed there and the rest is shared again among the others. The
    real-valued shares are rounded to nearest and corrected as in the paper (increment the layer with
    the largest residual while the sum is short, decrement the smallest while it is over), so the
    counts sum to the budget exactly. Only where every kept layer sits at its cap is part of the
    budget left unspent; the second value says how much.
    """
    num_layers = len(homogeneity)
    if exit_layer is None:
        exit_layer = num_layers
    if not 1 <= exit_layer <= num_layers:
        raise ValueError(f"exit_layer must lie in 1..{num_layers} (the number of layers embedded), got {exit_layer}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    moe = [layer for layer, s in enumerate(homogeneity) if s is not None]
    kept = [layer for layer in moe if layer < exit_layer]
    if not kept:
        raise ValueError(f"No MoE layer among the first {exit_layer} layers: nothing to allocate")
    budget = top_k * len(moe)
    weights = {layer: max(shift - homogeneity[layer], 0.0) ** alpha for layer in kept}
    if not any(weights.values()):
        raise ValueError(
            f"shift {shift} is not above any kept layer's homogeneity (max {max(homogeneity[i] for i in kept):.3f}): "
            "every layer would get the weight 0 (identical experts, as in an untrained upcycled model, "
            "have homogeneity 1)"
        )
    spendable = min(budget, sum(caps[layer] for layer in kept))
    target = water_fill(weights, caps, spendable)
    counts = round_to_budget(target, caps, spendable, homogeneity)
    layer_top_k = [None if s is None else counts.get(layer, 0) for layer, s in enumerate(homogeneity)]
    return layer_top_k, budget - spendable


def water_fill(weights: dict, caps: list, spendable: float) -> dict:
    """Real-valued expert counts of the layers in `weights`, summing to `spendable`: shares in proportion to the
    weights, a layer whose share falls below 1 or above its cap fixed there and the rest shared again."""
    target, free = {}, list(weights)
    while free:
        rest = spendable - sum(target.values())
        total = sum(weights[layer] for layer in free)
        share = {layer: rest * weights[layer] / total if total > 0 else rest / len(free) for layer in free}
        over = [layer for layer in free if share[layer] > caps[layer]]
        under = [layer for layer in free if share[layer] < 1]
        if not over and not under:
            target.update(share)
            break
        for layer in over or under:
            target[layer] = float(caps[layer]) if over else 1.0
            free.remove(layer)
    return target


def round_to_budget(target: dict, caps: list, spendable: int, homogeneity: list) -> dict:
    """`target` rounded to nearest within [1, cap], then corrected as in the paper until the counts sum to
    `spendable`: the layer with the largest residual gains while the sum is short, the smallest loses while over."""
    kept = sorted(target)  # layer order: ties go to the first layer
    counts = {layer: min(max(math.floor(target[layer] + 0.5), 1), caps[layer]) for layer in kept}
    # equal residuals: the less homogeneous layer gains first and loses last, so k stays monotone in s
    while sum(counts.values()) < spendable:
        layer = max((i for i in kept if counts[i] < caps[i]), key=lambda i: (target[i] - counts[i], -homogeneity[i]))
        counts[layer] += 1
    while sum(counts.values()) > spendable:
        layer = min((i for i in kept if counts[i] > 1), key=lambda i: (target[i] - counts[i], -homogeneity[i]))
        counts[layer] -= 1
    return counts


def attention_strength(attention_probs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """`a_i`: the strongest attention token `i` receives, over heads and real query positions.

    attention_probs `(batch, heads, queries, keys)`, mask `(batch, tokens)` (1 = real token).
    Returns `(batch, keys)` in fp32, 0 at padding keys. Padding queries are left out (their rows may
    hold anything, NaN included, depending on the backend's masking).
    """
    strongest = attention_probs.detach().float().amax(dim=1)  # (batch, queries, keys): max over heads
    real = mask.bool()
    strongest = strongest.masked_fill(~real[:, :, None], 0.0)  # probabilities are >= 0: 0 is neutral for max
    return strongest.amax(dim=1).masked_fill(~real, 0.0)


def allocate_tokens(
    strength: torch.Tensor, mask: torch.Tensor, layer_k: int, cap: int, rounding: str = "floor"
) -> torch.Tensor:
    """Per-token expert counts (paper section 4.2): `(batch, tokens)` int64, 0 at padding.

    `p_i = a_i / Σ_j a_j` over the real tokens of each sequence, budget `B = layer_k · T_real`.
    `"floor"` (the paper): `k_i = min(floor(B · p_i), cap)`; the floor and the cap lose part of the budget.
    `"largest-remainder"`: the floors, then one more expert at a time to the tokens with the largest
    remainder `B · p_i − k_i` (ties to the earlier token) that are below the cap, until the sequence
    spends exactly `B`. A sequence whose tokens receive no attention at all shares `B` evenly.
    """
    if rounding not in AEA_ROUNDINGS:
        raise ValueError(f"rounding must be one of {', '.join(AEA_ROUNDINGS)}, got {rounding!r}")
    real = mask.bool()
    strength = strength.float().masked_fill(~real, 0.0)
    num_real = real.sum(dim=-1, keepdim=True)
    total = strength.sum(dim=-1, keepdim=True)
    share_of = torch.where(total > 0, strength / total.clamp_min(1e-30), real.float() / num_real.clamp_min(1))
    budget = (layer_k * num_real).float()
    share = budget * share_of  # (batch, tokens), real-valued expert counts
    counts = torch.floor(share + _FLOOR_TOLERANCE).clamp(0, cap).masked_fill(~real, 0.0)
    if rounding == "largest-remainder":
        positions = torch.arange(share.shape[1], device=share.device).expand_as(share)
        for _ in range(cap):  # a token gains at most `cap` experts
            missing = (budget.squeeze(-1) - counts.sum(dim=-1)).round()
            eligible = real & (counts < cap)
            if not bool(((missing > 0) & eligible.any(dim=-1)).any()):
                break
            remainder = (share - counts).masked_fill(~eligible, float("-inf"))
            # rank by remainder, ties to the earlier position: a stable sort of the descending order
            order = torch.sort(remainder, dim=-1, descending=True, stable=True).indices
            rank = torch.empty_like(order).scatter_(1, order, positions)
            counts = counts + ((rank < missing[:, None]) & eligible).float()
    return counts.long()


__all__ = ["allocate_layers", "allocate_tokens", "attention_strength"]
