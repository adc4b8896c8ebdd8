"""Auxiliary losses of top-k routers, shared by the token-routed MoE and CoMoE: the Switch Transformer's
load-balancing loss (Fedus et al., 2022) and ST-MoE's router z-loss (Zoph et al., 2022).

Saved model folders carry this file inlined into their code: it imports only torch.
"""

import torch


def load_balancing_loss(router_logits: torch.Tensor, num_experts_per_tok: int) -> torch.Tensor:
    """Switch-Transformer load-balancing loss `E · Σ_i f_i · P_i` of one router.

    `f_i` is the fraction of the `tokens × k` routing slots assigned to expert `i` (no gradient),
    `P_i` the mean router probability of expert `i`. Equals 1 for perfectly uniform routing.
    `router_logits` is `(num_tokens, num_experts)` over non-padding tokens only.
    """
    num_experts = router_logits.shape[-1]
    if router_logits.shape[0] == 0:  # nothing routed (all padding): no imbalance
        return router_logits.sum() * 0.0
    probs = torch.softmax(router_logits.float(), dim=-1)
    chosen = torch.topk(probs, num_experts_per_tok, dim=-1).indices.reshape(-1)
    fraction = torch.bincount(chosen, minlength=num_experts).float() / chosen.numel()
    return num_experts * (fraction * probs.mean(dim=0)).sum()


def router_z_loss(router_logits: torch.Tensor) -> torch.Tensor:
    """Router z-loss: mean squared log-partition of the router logits `(num_tokens, num_experts)`."""
    if router_logits.shape[0] == 0:
        return router_logits.sum() * 0.0
    return torch.logsumexp(router_logits.float(), dim=-1).square().mean()


__all__ = ["load_balancing_loss", "router_z_loss"]
