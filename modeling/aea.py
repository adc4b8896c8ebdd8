"""AEA: Adaptive Expert Allocation for training-free sentence embeddings from top-k MoE models
(Yang et al., "AEA: Adaptive Expert Allocation Improves Sentence Embeddings from Mixture-of-Experts LLM").

Without changing a weight, the expert budget of a trained top-k MoE model is moved

- between layers (section 4.1): `k_l` from each layer's expert homogeneity `s_l` (mean pairwise cosine
  of all experts' outputs, measured once on calibration texts), fewer experts where experts agree,
  the budget of the layers after the exit layer reallocated to the kept ones; and
- between tokens (section 4.2): token `i` of a sequence of `T` real tokens gets
  `k_i = floor(k_l · T · p_i)` experts, `p_i` its share of the strongest attention it receives.

It works through forward hooks on the interface that transformers' MoE models share (OLMoE,
Qwen2-MoE, Qwen3-MoE, Mixtral, GraniteMoE, DeepSeek-V2/V3) and that this package's token-routed
encoder exposes too: a router module (named by `model._can_record_outputs["router_logits"]`) that
reads `self.top_k` at every forward and returns `(router_logits, top_k_weights, top_k_index)`, a
sibling `experts` module called as `experts(hidden, top_k_index, top_k_weights)`, and an attention
module (`_can_record_outputs["attentions"]`) returning `(output, attention_probs)` under eager
attention. No model code is forked; `AdaptiveExpertAllocation.apply()` installs the hooks and
removes them (and restores every router's `top_k`) on exit.

This file is copied into calibrated model folders: it imports only torch and public transformers names.
"""

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

# model_type -> how its router turns the chosen experts' scores into weights: does it renormalise them
# over the chosen experts (so that dropping a slot must rescale the others), and how many experts can
# one token get at most (group-limited routing keeps only `topk_group` of `n_group` groups).
SUPPORTED_FAMILIES = {
    "olmoe": {"normalises": lambda r: r.norm_topk_prob},
    "qwen2_moe": {"normalises": lambda r: r.norm_topk_prob},
    "qwen3_moe": {"normalises": lambda r: r.norm_topk_prob},
    "mixtral": {"normalises": lambda r: True},
    "granitemoe": {"normalises": lambda r: True},  # softmax over the top-k logits
    "deepseek_v2": {
        "normalises": lambda r: False,
        "cap": lambda r: (
            r.topk_group * (r.num_experts // r.num_group) if r.topk_method == "group_limited_greedy" else None
        ),
    },
    "deepseek_v3": {
        "normalises": lambda r: r.norm_topk_prob,
        "cap": lambda r: r.topk_group * (r.num_experts // r.num_group),
    },
    "moe_bert": {"normalises": lambda r: r.norm_topk_prob},
}

# Floor of a token's share of the budget, with this tolerance: a share that is an integer in exact
# arithmetic (uniform attention gives exactly `k_l` each) must not lose an expert to rounding.
_FLOOR_TOLERANCE = 1e-4


# ---------------------------------------------------------------------------------------------------
# Allocation rules: pure functions of the homogeneity scores and the attention strengths
# ---------------------------------------------------------------------------------------------------


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

    # Water-filling: share the budget in proportion to the weights, fixing layers at their bounds.
    target, free = {}, list(kept)
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

    counts = {layer: min(max(math.floor(target[layer] + 0.5), 1), caps[layer]) for layer in kept}
    # equal residuals: the less homogeneous layer gains first and loses last, so k stays monotone in s
    while sum(counts.values()) < spendable:
        layer = max((i for i in kept if counts[i] < caps[i]), key=lambda i: (target[i] - counts[i], -homogeneity[i]))
        counts[layer] += 1
    while sum(counts.values()) > spendable:
        layer = min((i for i in kept if counts[i] > 1), key=lambda i: (target[i] - counts[i], -homogeneity[i]))
        counts[layer] -= 1
    layer_top_k = [None if s is None else counts.get(layer, 0) for layer, s in enumerate(homogeneity)]
    return layer_top_k, budget - spendable


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
    if rounding not in ("floor", "largest-remainder"):
        raise ValueError(f"rounding must be 'floor' or 'largest-remainder', got {rounding!r}")
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


# ---------------------------------------------------------------------------------------------------
# The model's MoE layers, found through the interface transformers' MoE models share
# ---------------------------------------------------------------------------------------------------


def _recorded_class(model: nn.Module, key: str):
    """The module class `model._can_record_outputs[key]` names (a class, an `OutputRecorder` or a list)."""
    entry = (getattr(type(model), "_can_record_outputs", None) or {}).get(key)
    if isinstance(entry, (list, tuple)):
        entry = entry[0] if entry else None
    entry = getattr(entry, "target_class", entry)
    return entry if isinstance(entry, type) else None


@dataclass
class MoeLayerHandles:
    """The modules of one transformer layer that AEA touches (`router` is `None` in a dense layer)."""

    layer: nn.Module
    attention: nn.Module | None
    router: nn.Module | None = None
    experts: nn.Module | None = None
    num_experts: int = 0
    cap: int = 0
    normalises: bool = False


def find_moe_layers(model: nn.Module) -> tuple[str, list[MoeLayerHandles]]:
    """`(model_type, layers)` for a supported MoE model (a base model or one with a head).

    Raises:
        ValueError: for a family outside `SUPPORTED_FAMILIES` or a model without MoE layers.
    """
    base = getattr(model, "base_model", model)
    model_type = getattr(getattr(base, "config", None), "model_type", type(base).__name__)
    supported = ", ".join(sorted(SUPPORTED_FAMILIES))
    router_cls = _recorded_class(base, "router_logits")
    if model_type not in SUPPORTED_FAMILIES:
        is_moe = router_cls is not None or "moe" in model_type
        kind = "an MoE family AEA does not support" if is_moe else "not a supported MoE model"
        raise ValueError(f"model_type {model_type!r} is {kind}; AEA supports: {supported}")
    attention_cls = _recorded_class(base, "attentions")
    if router_cls is None or attention_cls is None:
        raise ValueError(
            f"{type(base).__name__} does not name its router and attention classes in `_can_record_outputs`"
        )
    layer_lists = [
        m for m in base.modules() if isinstance(m, nn.ModuleList) and len(m) == base.config.num_hidden_layers
    ]
    if not layer_lists:
        raise ValueError(f"Cannot find the {base.config.num_hidden_layers} layers of {type(base).__name__}")
    family = SUPPORTED_FAMILIES[model_type]
    layers = []
    for layer in layer_lists[0]:
        attention = next((m for m in layer.modules() if isinstance(m, attention_cls)), None)
        handles = MoeLayerHandles(layer=layer, attention=attention)
        for block in layer.modules():
            routers = [m for m in block.children() if isinstance(m, router_cls)]
            if routers and isinstance(getattr(block, "experts", None), nn.Module):
                handles.router, handles.experts = routers[0], block.experts
                handles.num_experts = routers[0].weight.shape[0]
                cap = family.get("cap", lambda r: None)(routers[0])
                handles.cap = min(cap, handles.num_experts) if cap else handles.num_experts
                handles.normalises = bool(family["normalises"](routers[0]))
                break
        layers.append(handles)
    if not any(h.router is not None for h in layers):
        raise ValueError(f"{type(base).__name__} has no MoE layer (no {router_cls.__name__} with an `experts` sibling)")
    return model_type, layers


def _flat_rows(values: torch.Tensor, mask: torch.Tensor, num_rows: int) -> torch.Tensor:
    """`(batch, tokens, ...)` -> the layout of an MoE layer's `num_rows` token rows: every token
    (transformers' decoders route padding too) or the real tokens only (this package's encoder)."""
    batch, tokens = mask.shape
    if num_rows == batch * tokens:
        return values.reshape(batch * tokens, *values.shape[2:])
    if num_rows == int(mask.sum()):
        return values[mask.bool()]
    raise RuntimeError(f"An MoE layer saw {num_rows} token rows; expected {batch * tokens} or {int(mask.sum())}")


def _grid_rows(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Inverse of `_flat_rows`: `(num_rows, ...)` -> `(batch, tokens, ...)`, zeros where not routed."""
    batch, tokens = mask.shape
    if rows.shape[0] == batch * tokens:
        return rows.reshape(batch, tokens, *rows.shape[1:])
    grid = rows.new_zeros(batch, tokens, *rows.shape[1:])
    grid[mask.bool()] = rows
    return grid


class _EarlyExit(Exception):
    """Raised by the exit layer's hook to stop the forward pass once the embedded layer has run."""


@dataclass
class AeaOutput:
    """`hidden_states` `(batch, tokens, hidden)`: the output of the exit layer; `routing_probs`: the
    softmax of the router logits of each MoE layer that ran, `(batch, tokens, experts)`, when asked."""

    hidden_states: torch.Tensor
    routing_probs: tuple | None = None


@dataclass
class _Call:
    """State of one forward pass, shared by its hooks."""

    mask: torch.Tensor
    token_top_k: dict
    keep: dict
    compact_rows: dict
    routing: list | None
    exit_hidden: torch.Tensor | None = None


class AdaptiveExpertAllocation:
    """Runs a supported MoE model with per-layer and per-token expert counts.

    Args:
        model: a supported MoE model (see `SUPPORTED_FAMILIES`), base model or with a head.
        layer_top_k: one entry per layer, as in `aea_config.json`: the layer's k, 0 after the exit layer,
            `None` for a dense layer. `None`: every MoE layer keeps its own `top_k`.
        token_wise: reallocate each layer's budget between tokens by attention strength; needs the model
            loaded with `attn_implementation="eager"`.
        rounding: `"floor"` (the paper) or `"largest-remainder"`, see `allocate_tokens`.
        exit_layer: number of layers whose output is embedded, 1..L (default: the last layer whose
            `layer_top_k` is not 0).

    Use:

    ```python
    >>> aea = AdaptiveExpertAllocation(model, layer_top_k=[...], token_wise=True)
    >>> with aea.apply():
    ...     out = aea(input_ids, attention_mask)  # AeaOutput
    ```

    Calls are serialised by a lock: the hooks share one state per forward pass.
    """

    def __init__(self, model: nn.Module, layer_top_k=None, token_wise=False, rounding="floor", exit_layer=None):
        self.model = model
        self.base = getattr(model, "base_model", model)
        self.model_type, self.layers = find_moe_layers(model)
        num_layers = len(self.layers)
        if layer_top_k is None:
            layer_top_k = [h.router.top_k if h.router is not None else None for h in self.layers]
        if len(layer_top_k) != num_layers:
            raise ValueError(f"layer_top_k has {len(layer_top_k)} entries; the model has {num_layers} layers")
        for index, (k, handles) in enumerate(zip(layer_top_k, self.layers, strict=True)):
            if (k is None) != (handles.router is None):
                kind = "dense" if handles.router is None else "an MoE layer"
                raise ValueError(f"layer_top_k[{index}] = {k!r}, but layer {index} is {kind}")
            if k is not None and not 0 <= k <= handles.cap:
                raise ValueError(f"layer_top_k[{index}] = {k} is outside 0..{handles.cap} for layer {index}")
        if exit_layer is None:
            used = [i for i, k in enumerate(layer_top_k) if k != 0]
            exit_layer = used[-1] + 1 if used else num_layers
        if not 1 <= exit_layer <= num_layers:
            raise ValueError(f"exit_layer must lie in 1..{num_layers}, got {exit_layer}")
        for index in range(exit_layer):
            if layer_top_k[index] == 0:
                raise ValueError(f"layer {index} runs (exit layer {exit_layer}) but has k = 0")
        self.layer_top_k = list(layer_top_k)
        self.token_wise = token_wise
        if rounding not in ("floor", "largest-remainder"):
            raise ValueError(f"rounding must be 'floor' or 'largest-remainder', got {rounding!r}")
        self.rounding = rounding
        self.exit_layer = exit_layer
        self.is_causal = bool(getattr(self.layers[0].attention, "is_causal", False))
        self._lock = threading.Lock()
        self._call: _Call | None = None
        self._applied = False

    # ---- hooks ---------------------------------------------------------------------------------

    def _attention_hook(self, index):
        def hook(module, args, output):
            call = self._call
            if call is None:
                return None
            probs = output[1] if isinstance(output, tuple) and len(output) > 1 else None
            if probs is None:
                raise ValueError(
                    "Token-wise expert allocation needs attention probabilities: load the model with "
                    "attn_implementation='eager'"
                )
            handles = self.layers[index]
            strength = attention_strength(probs, call.mask)
            call.token_top_k[index] = allocate_tokens(
                strength, call.mask, self.layer_top_k[index], handles.cap, self.rounding
            )
            return None

        return hook

    def _router_pre_hook(self, index):
        def hook(module, args):
            call = self._call
            token_k = call.token_top_k.get(index) if call is not None else None
            # the router picks the largest k of the batch; slots beyond a token's own k are dropped after
            module.top_k = max(int(token_k.max()), 1) if token_k is not None else self.layer_top_k[index]
            return None

        return hook

    def _router_hook(self, index):
        def hook(module, args, output):
            call = self._call
            if call is None:
                return None
            logits, weights, chosen = output
            if call.routing is not None:
                call.routing.append(_grid_rows(torch.softmax(logits.float(), dim=-1), call.mask))
            token_k = call.token_top_k.get(index)
            if token_k is None:
                return None
            token_k = _flat_rows(token_k, call.mask, weights.shape[0])
            slots = weights.shape[1]
            if bool((token_k == slots).all()):
                return None  # every token keeps every slot: untouched
            # rank of each slot by weight (0 = largest), without reordering the slots
            rank = torch.argsort(torch.argsort(weights, dim=-1, descending=True, stable=True), dim=-1)
            keep = rank < token_k[:, None]
            kept = torch.where(keep, weights, torch.zeros_like(weights))
            if self.layers[index].normalises:  # the router spread its total over the slots: keep it
                kept_sum = kept.sum(dim=-1, keepdim=True)
                scale = torch.where(kept_sum > 0, weights.sum(dim=-1, keepdim=True) / kept_sum, kept_sum)
                kept = kept * scale
            real = _flat_rows(call.mask, call.mask, weights.shape[0])
            if bool(keep[real].all()):
                # only padding rows (which transformers' decoders route too) lose slots: zero weights suffice,
                # and every real token takes exactly the unmodified path
                return logits, kept, chosen
            call.keep[index] = keep  # real tokens lose slots: the experts get only the kept ones
            return logits, kept, chosen

        return hook

    def _experts_pre_hook(self, index):
        def hook(module, args, kwargs):
            call = self._call
            keep = call.keep.pop(index, None) if call is not None else None
            if keep is None:
                return None
            # only the kept slots reach the experts, one row per (token, slot): the dropped ones cost nothing
            hidden, chosen, weights = _experts_arguments(args, kwargs)
            token, slot = keep.nonzero(as_tuple=True)
            call.compact_rows[index] = (token, hidden.shape[0])
            compact = (hidden.index_select(0, token), chosen[token, slot][:, None], weights[token, slot][:, None])
            return compact, {}

        return hook

    def _experts_hook(self, index):
        def hook(module, args, output):
            call = self._call
            rows = call.compact_rows.pop(index, None) if call is not None else None
            if rows is None:
                return None
            token, num_tokens = rows
            return output.new_zeros(num_tokens, output.shape[-1]).index_add_(0, token, output)

        return hook

    def _exit_hook(self, module, args, output):
        call = self._call
        if call is None:
            return None
        call.exit_hidden = output[0] if isinstance(output, tuple) else output
        raise _EarlyExit

    @contextmanager
    def apply(self):
        """Install the hooks and set each router's `top_k`; on exit remove them and restore `top_k`."""
        if self._applied:
            raise RuntimeError("AdaptiveExpertAllocation.apply() is already active")
        handles, saved_top_k = [], {}
        try:
            for index, layer in enumerate(self.layers[: self.exit_layer]):
                if layer.router is None:
                    continue
                saved_top_k[index] = layer.router.top_k
                layer.router.top_k = self.layer_top_k[index]
                handles.append(layer.router.register_forward_pre_hook(self._router_pre_hook(index)))
                handles.append(layer.router.register_forward_hook(self._router_hook(index)))
                handles.append(layer.experts.register_forward_pre_hook(self._experts_pre_hook(index), with_kwargs=True))
                handles.append(layer.experts.register_forward_hook(self._experts_hook(index)))
                if self.token_wise:
                    handles.append(layer.attention.register_forward_hook(self._attention_hook(index)))
            handles.append(self.layers[self.exit_layer - 1].layer.register_forward_hook(self._exit_hook))
            self._applied = True
            yield self
        finally:
            for handle in handles:
                handle.remove()
            for index, top_k in saved_top_k.items():
                self.layers[index].router.top_k = top_k
            self._applied = False

    def __call__(self, input_ids: torch.Tensor, attention_mask=None, output_routing_probs=False) -> AeaOutput:
        """Embed one batch up to the exit layer (inside `apply()`)."""
        if not self._applied:
            raise RuntimeError("Call the allocation inside `with aea.apply():`")
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        with self._lock:
            self._call = _Call(
                mask=attention_mask.bool(),
                token_top_k={},
                keep={},
                compact_rows={},
                routing=[] if output_routing_probs else None,
            )
            try:
                run_model(self.base, input_ids, attention_mask)
                raise RuntimeError("The exit layer's hook did not fire")
            except _EarlyExit:
                call = self._call
            finally:
                self._call = None
        routing = tuple(call.routing) if call.routing is not None else None
        return AeaOutput(hidden_states=call.exit_hidden, routing_probs=routing)


def _experts_arguments(args: tuple, kwargs: dict):
    """`(hidden_states, top_k_index, top_k_weights)` of an `experts(...)` call, positional or by keyword."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args) + [kwargs[name] for name in names[len(args) :]]
    return values[0], values[1], values[2]


def run_model(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """Forward of the base model with positions counted from each row's first real token, so that a
    left-padded row is embedded as if it were alone."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if not bool(attention_mask[:, 0].all()):  # left padding: positions must not count the padding
        offset = getattr(base.config, "position_offset", 0)
        kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0) + offset
    if getattr(base.config, "use_cache", None) is not None:
        kwargs["use_cache"] = False
    return base(**kwargs)


# ---------------------------------------------------------------------------------------------------
# Calibration: expert homogeneity per layer
# ---------------------------------------------------------------------------------------------------


def last_real_token(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token, for right or left padding: `(batch,)`."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask.bool(), positions, -1).amax(dim=-1)


def expert_cosines(experts: nn.Module, hidden: torch.Tensor, num_experts: int) -> torch.Tensor:
    """Mean pairwise cosine of all experts' outputs for each row of `hidden` `(n, hidden)`: `(n,)`.

    The layer's own `experts` module computes every expert on every row (whatever its backend or
    weight layout), with weight 1.
    """
    n = hidden.shape[0]
    inputs = hidden.repeat_interleave(num_experts, dim=0)
    index = torch.arange(num_experts, device=hidden.device).repeat(n)[:, None]
    outputs = experts(inputs, index, torch.ones_like(index, dtype=hidden.dtype)).float().view(n, num_experts, -1)
    unit = nn.functional.normalize(outputs, dim=-1)
    gram = unit @ unit.transpose(1, 2)
    pairs = torch.triu_indices(num_experts, num_experts, offset=1, device=hidden.device)
    return gram[:, pairs[0], pairs[1]].mean(dim=-1)


@torch.no_grad()
def measure_homogeneity(model: nn.Module, batches) -> list:
    """Expert homogeneity `s_l` of every layer (`None` for dense layers), paper section 4.1: the mean
    pairwise cosine of all experts' outputs for the final real token of each text, averaged over the
    texts. `batches` yields `(input_ids, attention_mask)`; the model runs unmodified.
    """
    _, layers = find_moe_layers(model)
    base = getattr(model, "base_model", model)
    captured: dict = {}
    state = {}

    def capture(index):
        def hook(module, args, kwargs):
            hidden = _experts_arguments(args, kwargs)[0]
            mask = state["mask"]
            is_last = torch.zeros_like(mask, dtype=torch.bool)
            is_last[torch.arange(mask.shape[0], device=mask.device), last_real_token(mask)] = True
            rows = _flat_rows(is_last, mask, hidden.shape[0]).nonzero().squeeze(-1)  # in the layer's row layout
            captured.setdefault(index, []).append(hidden.index_select(0, rows))

        return hook

    sums, counts = {}, {}
    for input_ids, attention_mask in batches:
        state["mask"] = attention_mask
        handles = [
            h.experts.register_forward_pre_hook(capture(i), with_kwargs=True)
            for i, h in enumerate(layers)
            if h.router is not None
        ]
        try:
            run_model(base, input_ids, attention_mask)
        finally:
            for handle in handles:
                handle.remove()
        for index, chunks in captured.items():
            cosines = expert_cosines(layers[index].experts, torch.cat(chunks), layers[index].num_experts)
            sums[index] = sums.get(index, 0.0) + float(cosines.sum())
            counts[index] = counts.get(index, 0) + cosines.numel()
        captured.clear()
    if not counts:
        raise ValueError("No calibration text: the homogeneity needs at least one")
    return [sums[i] / counts[i] if h.router is not None else None for i, h in enumerate(layers)]


# ---------------------------------------------------------------------------------------------------
# Sentence embeddings
# ---------------------------------------------------------------------------------------------------

EMBEDDINGS = ("hidden", "moee-concat", "moee-sum")


def pool(values: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`(batch, tokens, d)` -> `(batch, d)`: the last real token (`"last"`) or the mean over real tokens."""
    if pooling == "last":
        return values[torch.arange(values.shape[0], device=values.device), last_real_token(mask)]
    if pooling == "mean":
        weights = mask.to(values.dtype).unsqueeze(-1)
        return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1)
    raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")


def sentence_embedding(output: AeaOutput, mask: torch.Tensor, pooling: str, embedding: str = "hidden") -> torch.Tensor:
    """The sentence embedding of each row, from that row alone.

    `"hidden"`: the pooled hidden state of the exit layer. MoEE (Li & Zhou, 2025) adds the routing weights
    of every MoE layer that ran, pooled the same way and concatenated over layers (RW): `"moee-concat"`
    is `[HS; RW]`; `"moee-sum"` is `[HS/‖HS‖; RW/‖RW‖]`, whose cosine similarity is the mean of the two
    cosines, so it ranks pairs as MoEE's sum of similarities does.
    """
    hidden = pool(output.hidden_states.float(), mask, pooling)
    if embedding == "hidden":
        return hidden
    if embedding not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {embedding!r}")
    if not output.routing_probs:
        raise ValueError("MoEE embeddings need the routing probabilities: call with output_routing_probs=True")
    routing = torch.cat([pool(probs, mask, pooling) for probs in output.routing_probs], dim=-1)
    if embedding == "moee-concat":
        return torch.cat([hidden, routing], dim=-1)
    return torch.cat([nn.functional.normalize(hidden, dim=-1), nn.functional.normalize(routing, dim=-1)], dim=-1)


__all__ = [
    "AdaptiveExpertAllocation",
    "AeaOutput",
    "SUPPORTED_FAMILIES",
    "EMBEDDINGS",
    "allocate_layers",
    "allocate_tokens",
    "attention_strength",
    "expert_cosines",
    "find_moe_layers",
    "measure_homogeneity",
    "pool",
    "sentence_embedding",
]
