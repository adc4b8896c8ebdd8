"""The MoE layers of a model, found through the interface transformers' MoE models share (OLMoE, Qwen2-MoE,
Qwen3-MoE, Mixtral, GraniteMoE, DeepSeek-V2/V3) and this package's token-routed encoder exposes too: a
router module (named by `model._can_record_outputs["router_logits"]`) that reads `self.top_k` at every
forward and returns `(router_logits, top_k_weights, top_k_index)`, a sibling `experts` module called as
`experts(hidden, top_k_index, top_k_weights)`, and an attention module (`_can_record_outputs["attentions"]`)
returning `(output, attention_probs)` under eager attention. No model code is forked.

Calibrated model folders carry this file inlined into their code: it imports only torch.
"""

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


def flat_rows(values: torch.Tensor, mask: torch.Tensor, num_rows: int) -> torch.Tensor:
    """`(batch, tokens, ...)` -> the layout of an MoE layer's `num_rows` token rows: every token
    (transformers' decoders route padding too) or the real tokens only (this package's encoder)."""
    batch, tokens = mask.shape
    if num_rows == batch * tokens:
        return values.reshape(batch * tokens, *values.shape[2:])
    if num_rows == int(mask.sum()):
        return values[mask.bool()]
    raise RuntimeError(f"An MoE layer saw {num_rows} token rows; expected {batch * tokens} or {int(mask.sum())}")


def grid_rows(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Inverse of `flat_rows`: `(num_rows, ...)` -> `(batch, tokens, ...)`, zeros where not routed."""
    batch, tokens = mask.shape
    if rows.shape[0] == batch * tokens:
        return rows.reshape(batch, tokens, *rows.shape[1:])
    grid = rows.new_zeros(batch, tokens, *rows.shape[1:])
    grid[mask.bool()] = rows
    return grid


def experts_arguments(args: tuple, kwargs: dict):
    """`(hidden_states, top_k_index, top_k_weights)` of an `experts(...)` call, positional or by keyword."""
    names = ("hidden_states", "top_k_index", "top_k_weights")
    values = list(args) + [kwargs[name] for name in names[len(args) :]]
    return values[0], values[1], values[2]


def run_model(base: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids=None):
    """Forward of the base model with positions counted from each row's first real token, so that a
    left-padded row is embedded as if it were alone; `token_type_ids` are passed on where given."""
    kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
    if token_type_ids is not None:
        kwargs["token_type_ids"] = token_type_ids
    if not bool(attention_mask[:, 0].all()):  # left padding: positions must not count the padding
        offset = getattr(base.config, "position_offset", 0)
        kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0) + offset
    if getattr(base.config, "use_cache", None) is not None:
        kwargs["use_cache"] = False
    return base(**kwargs)


__all__ = [
    "SUPPORTED_FAMILIES",
    "MoeLayerHandles",
    "find_moe_layers",
    "flat_rows",
    "grid_rows",
    "experts_arguments",
    "run_model",
]
