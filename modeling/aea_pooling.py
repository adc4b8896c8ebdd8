"""Sentence embeddings of an AEA run: the exit layer's hidden states pooled (last real token or mean), and
MoEE's embeddings with the routing weights (Li & Zhou, 2025).

Calibrated model folders carry this file inlined into their code: it imports only torch.
"""

import torch
from torch import nn

from .defaults import AEA_EMBEDDINGS


def last_real_token(mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last real token, for right or left padding: `(batch,)`."""
    positions = torch.arange(mask.shape[1], device=mask.device)
    return torch.where(mask.bool(), positions, -1).amax(dim=-1)


EMBEDDINGS = AEA_EMBEDDINGS


def pool(values: torch.Tensor, mask: torch.Tensor, pooling: str) -> torch.Tensor:
    """`(batch, tokens, d)` -> `(batch, d)`: the last real token (`"last"`) or the mean over real tokens."""
    if pooling == "last":
        return values[torch.arange(values.shape[0], device=values.device), last_real_token(mask)]
    if pooling == "mean":
        weights = mask.to(values.dtype).unsqueeze(-1)
        return (values * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1)
    raise ValueError(f"pooling must be 'last' or 'mean', got {pooling!r}")


def sentence_embedding(output, mask: torch.Tensor, pooling: str, embedding: str = "hidden") -> torch.Tensor:
    """The sentence embedding of each row of an `AeaOutput`, from that row alone.

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


__all__ = ["EMBEDDINGS", "last_real_token", "pool", "sentence_embedding"]
