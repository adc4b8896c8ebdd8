"""AEA's calibration: the expert homogeneity of every MoE layer (Yang et al., section 4.1), the mean pairwise
cosine of all experts' outputs for the final real token of each calibration text.

Calibrated model folders carry this file inlined into their code: it imports only torch and its siblings.
"""

import torch
from torch import nn

from .aea_layers import experts_arguments, find_moe_layers, flat_rows, run_model
from .aea_pooling import last_real_token


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
            hidden = experts_arguments(args, kwargs)[0]
            mask = state["mask"]
            is_last = torch.zeros_like(mask, dtype=torch.bool)
            is_last[torch.arange(mask.shape[0], device=mask.device), last_real_token(mask)] = True
            rows = flat_rows(is_last, mask, hidden.shape[0]).nonzero().squeeze(-1)  # in the layer's row layout
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


__all__ = ["expert_cosines", "measure_homogeneity"]
