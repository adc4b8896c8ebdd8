"""AEA at run time: `AdaptiveExpertAllocation` runs a supported MoE model (`aea_layers.py`) with per-layer and
per-token expert counts (`aea_allocation.py`) and stops at the exit layer, without changing a weight.
`apply()` installs forward hooks on the routers, experts and attention modules and removes them (and
restores every router's `top_k`) on exit. It is called as a transformers model is: `aea(**tokenizer(texts))`
(`token_type_ids` included), and answers `last_hidden_state`.

Calibrated model folders carry this file inlined into their code: it imports only torch, public transformers
names and its siblings.
"""

import inspect
import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from transformers.utils import ModelOutput

from .aea_allocation import allocate_tokens, attention_strength
from .aea_layers import experts_arguments, find_moe_layers, flat_rows, grid_rows, run_model
from .defaults import AEA_ROUNDINGS

logger = logging.getLogger(__name__)

EAGER_NEEDED = (
    "Token-wise expert allocation needs attention probabilities: load the model with attn_implementation='eager'"
)


class _EarlyExit(Exception):
    """Raised by the exit layer's hook to stop the forward pass once the embedded layer has run."""


@dataclass
class AeaOutput(ModelOutput):
    """What an AEA forward returns, as transformers' model outputs do (`out.last_hidden_state`, `out[0]`).

    Args:
        last_hidden_state (`torch.Tensor` of shape `(batch, tokens, hidden)`): the output of the exit layer.
        routing_probs (`tuple[torch.Tensor]`, *optional*): when asked, the softmax of the router logits of each
            MoE layer that ran, `(batch, tokens, experts)`.
    """

    last_hidden_state: torch.Tensor | None = None
    routing_probs: tuple | None = None

    @property
    def hidden_states(self) -> torch.Tensor:
        """`last_hidden_state`, under the name this output had first."""
        return self.last_hidden_state


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
        token_wise: reallocate each layer's budget between tokens by attention strength, read from the
            attention probabilities that only eager attention returns: a model loaded with another (sdpa, the
            default) is switched to `attn_implementation="eager"` here.
        rounding: `"floor"` (the paper) or `"largest-remainder"`, see `allocate_tokens`.
        exit_layer: number of layers whose output is embedded, 1..L (default: the last layer whose
            `layer_top_k` is not 0).

    Use:

    ```python
    >>> aea = AdaptiveExpertAllocation(model, layer_top_k=[...], token_wise=True)
    >>> with aea.apply():
    ...     out = aea(**tokenizer(texts, padding=True, return_tensors="pt"))  # AeaOutput: out.last_hidden_state
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
        if token_wise:
            use_eager_attention(model)
        # a tokenizer's `token_type_ids` reach a model that reads them (BERT-like); decoders have none
        self._takes_token_types = "token_type_ids" in inspect.signature(self.base.forward).parameters
        if rounding not in AEA_ROUNDINGS:
            raise ValueError(f"rounding must be one of {', '.join(AEA_ROUNDINGS)}, got {rounding!r}")
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
            if probs is None:  # switched back to another attention after construction
                raise ValueError(EAGER_NEEDED)
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
                call.routing.append(grid_rows(torch.softmax(logits.float(), dim=-1), call.mask))
            token_k = call.token_top_k.get(index)
            if token_k is None:
                return None
            token_k = flat_rows(token_k, call.mask, weights.shape[0])
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
            real = flat_rows(call.mask, call.mask, weights.shape[0])
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
            hidden, chosen, weights = experts_arguments(args, kwargs)
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

    def __call__(
        self, input_ids: torch.Tensor, attention_mask=None, output_routing_probs=False, *, token_type_ids=None
    ) -> AeaOutput:
        """Embed one batch up to the exit layer (inside `apply()`); `token_type_ids` go to a model that reads
        them and are ignored by one that has none (a decoder)."""
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
                token_types = token_type_ids if self._takes_token_types else None
                run_model(self.base, input_ids, attention_mask, token_types)
                raise RuntimeError("The exit layer's hook did not fire")
            except _EarlyExit:
                call = self._call
            finally:
                self._call = None
        routing = tuple(call.routing) if call.routing is not None else None
        return AeaOutput(last_hidden_state=call.exit_hidden, routing_probs=routing)


def use_eager_attention(model: nn.Module) -> None:
    """Switch `model` to eager attention (`set_attn_implementation`), which token-wise allocation reads; one
    that cannot switch is refused in one line."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", "eager") == "eager":
        return
    switch = getattr(model, "set_attn_implementation", None)
    if switch is not None:
        switch("eager")
    if model.config._attn_implementation != "eager":
        raise ValueError(EAGER_NEEDED)
    logger.info("token-wise allocation reads attention probabilities: the model now runs eager attention")


__all__ = ["AdaptiveExpertAllocation", "AeaOutput", "use_eager_attention"]
