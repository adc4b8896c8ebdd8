"""The CoMoE linear (Feng et al., 2025, "CoMoE: Contrastive Representation for Mixture-of-Experts in
Parameter-Efficient Fine-tuning"): a frozen linear plus top-k routed LoRA experts, the contrastive expert
loss between its activated and inactivated experts (Algorithm 1), and the maths of merging the experts
into the frozen weight.

Every target linear of every adapter layer becomes a `CoMoeLinear`: the base `weight` and `bias` (the
names of `nn.Linear`, so dense checkpoints load unchanged), `num_local_experts` LoRA experts stored
stacked (`lora_A` `(E, r, in)`, `lora_B` `(E, out, r)`) and a router `(E, in)` computed in fp32. Each
non-padding token goes to its top-k experts with the router's softmax renormalised over them (eq. 3):

    y = W x + b + Σ_{i ∈ top-k(x)} g_i(x) · (alpha / r) · B_i A_i x

The forward is two matmuls whatever the routing: every expert's rank-r code `A_i x` at once
(`(tokens, E·r)`), then the gated codes times the stacked `B`, added into the base output. In training with
λ > 0 every pair of experts is compared as well, for the contrastive expert loss.

Which tokens are padding, and where a linear reports its router logits and losses, reach it as an argument:
its layer (`modeling_comoe.CoMoeLayer`) makes a `LayerRouting` for each forward pass and the encoder hands it to
every projection whose linear reads it (`modeling_encoder.project`); nothing is stored on a module, so concurrent
forward passes on several threads do not mix.

Saved model folders carry this file inlined into their code: it imports only torch.
"""

from dataclasses import dataclass, field

import torch
from torch import nn

ADAPTER_SUFFIXES = (".lora_A", ".lora_B", ".router.weight")


def is_adapter_key(name: str) -> bool:
    """Whether a parameter name belongs to the adapters (LoRA experts or routers), not the frozen base."""
    return name.endswith(ADAPTER_SUFFIXES)


@dataclass(frozen=True)
class CoMoeRouting:
    """Decided once per forward pass: the flat indices of non-padding tokens (`None`: no padding) and
    whether the linears compute the contrastive expert loss."""

    token_index: torch.LongTensor | None
    contrastive: bool = False


@dataclass
class CoMoeLayerAux:
    """What the CoMoE linears of one layer report during one forward pass, in call order."""

    router_logits: list = field(default_factory=list)
    contrastive_losses: list = field(default_factory=list)
    expert_counts: list = field(default_factory=list)


@dataclass(frozen=True)
class LayerRouting:
    """What a layer hands its CoMoE linears for one forward pass: the model's routing and where to report."""

    routing: CoMoeRouting | None
    aux: CoMoeLayerAux


def cosine_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """Cosines `G_ij / sqrt((G_ii + 1e-12)(G_jj + 1e-12))` from Gram matrices `(..., n, n)`: those of
    the unit vectors `v / sqrt(|v|² + 1e-12)`, so 0 (with a finite gradient) for a zero vector."""
    norms = torch.rsqrt(torch.diagonal(gram, dim1=-2, dim2=-1).clamp_min(0) + 1e-12)
    return gram * norms.unsqueeze(-1) * norms.unsqueeze(-2)


def expert_similarities(codes: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """`(tokens, E, E)`: for each pair of experts, the mean of the cosine of their rank-r codes `A_i x`
    and the cosine of their outputs `B_i A_i x`: the similarity the contrastive loss compares.

    It equals the dot product of the vectors `[unit(A_i x), unit(B_i A_i x)] / √2`. With `B = 0`
    (upcycled) every output is zero, the outputs' cosine is 0 with no gradient, and the codes (A is
    random) carry the loss from step 0; as the B_i move away from 0 the outputs' half becomes the
    paper's comparison of expert outputs (see docs/architecture.md). The outputs' dot products come
    from the Gram matrix of the stacked B (`c_i^T B_i^T B_j c_j`), so the `(tokens, E, out)` outputs
    are never formed: a few hundred numbers per token instead of `E · out`.

    Args:
        codes: `(tokens, E, r)` every expert's code.
        lora_b: `(E, out, r)` the stacked B.
    """
    codes = codes.float()
    num_experts, out_features, rank = lora_b.shape
    flat_b = lora_b.float().transpose(0, 1).reshape(out_features, num_experts * rank)
    b_gram = (flat_b.T @ flat_b).view(num_experts, rank, num_experts, rank)  # B_i^T B_j blocks
    output_gram = torch.einsum("tjb,iajb,tia->tij", codes, b_gram, codes)
    code_gram = codes @ codes.transpose(1, 2)
    return 0.5 * (cosine_from_gram(code_gram) + cosine_from_gram(output_gram))


def contrastive_expert_loss(
    similarities: torch.Tensor, top_k_index: torch.Tensor, anchor_slot: torch.Tensor, tau: float, eps: float
) -> torch.Tensor:
    """The contrastive expert loss (paper, Algorithm 1) averaged over tokens.

    For token t the anchor is the expert `top_k_index[t, anchor_slot[t]]`, the positives are its other
    activated experts and the negatives the inactivated ones; with `s` the anchor's similarities to
    them divided by `tau`, the loss is `-log(Σ exp(s_pos) / (Σ exp([s_pos, s_neg]) + eps))`.

    Args:
        similarities: `(tokens, E, E)` cosine similarities between experts (`expert_similarities`).
        top_k_index: `(tokens, k)` activated experts, `k >= 2`.
        anchor_slot: `(tokens,)` position in `0..k-1` of each token's anchor.
    """
    num_tokens, num_experts, _ = similarities.shape
    if num_tokens == 0:
        return similarities.sum() * 0.0
    anchor = top_k_index.gather(1, anchor_slot.unsqueeze(1))  # (tokens, 1)
    scores = similarities.gather(1, anchor.unsqueeze(-1).expand(-1, -1, num_experts)).squeeze(1) / tau
    others = torch.ones_like(scores, dtype=torch.bool).scatter(1, anchor, False)
    positive = torch.zeros_like(others).scatter(1, top_k_index, True) & others
    log_positive = torch.logsumexp(scores.masked_fill(~positive, float("-inf")), dim=1)
    log_all = torch.logsumexp(scores.masked_fill(~others, float("-inf")), dim=1)
    # log(Σ exp(s) + ε) computed without overflow
    loss = log_all + torch.log1p(eps * torch.exp(-log_all)) - log_positive
    return loss.mean()


def top_k_gates(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(weights, index)` of the top-k experts per token: the router's softmax, renormalised over the
    chosen experts to sum to 1 (paper eq. 3), computed as the softmax of the k largest logits (the same
    numbers, without a softmax over all experts). `router_logits` is `(tokens, E)`."""
    logits, index = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(logits, dim=-1), index


class CoMoeRouter(nn.Module):
    """`Linear(in_features, num_experts, bias=False)`, computed in fp32 even under autocast."""

    def __init__(self, in_features: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, in_features))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return nn.functional.linear(hidden_states.float(), self.weight.float())


class CoMoeLinear(nn.Module):
    """A frozen linear (`weight`, `bias`) plus top-k routed LoRA experts (`lora_A`, `lora_B`, `router`). Called
    as `linear(hidden_states, layer_routing)` by its layer (without `layer_routing`, every token is routed and
    nothing is reported)."""

    takes_routing = True  # `modeling_encoder.project` hands it the layer's `LayerRouting`

    def __init__(self, in_features: int, out_features: int, config, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.num_experts, self.top_k, self.rank = config.num_local_experts, config.num_experts_per_tok, config.lora_rank
        self.scaling = config.lora_scaling
        self.tau, self.eps = config.contrastive_tau, config.contrastive_eps
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None  # a base without biases (ModernBERT)
        self.lora_A = nn.Parameter(torch.empty(self.num_experts, self.rank, in_features))
        self.lora_B = nn.Parameter(torch.empty(self.num_experts, out_features, self.rank))
        self.router = CoMoeRouter(in_features, self.num_experts)
        self.lora_dropout = nn.Dropout(config.lora_dropout)

    def route(self, tokens: torch.Tensor):
        """`(logits, weights, index)` for `(tokens, in)`: fp32 logits, top-k weights renormalised to sum to 1."""
        logits = self.router(tokens)
        return (logits, *top_k_gates(logits, self.top_k))

    def expert_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every expert's rank-r code `A_i x` (dropout in training), `(tokens, E, r)`, in one matmul."""
        flat_a = self.lora_A.reshape(self.num_experts * self.rank, self.in_features)
        return nn.functional.linear(self.lora_dropout(tokens), flat_a).view(-1, self.num_experts, self.rank)

    def expert_outputs(self, codes: torch.Tensor) -> torch.Tensor:
        """Every expert's scaled output `(alpha / r) · B_i A_i x`, `(tokens, E, out)`."""
        return torch.einsum("ter,eor->teo", codes, self.lora_B) * self.scaling

    def forward(self, hidden_states: torch.Tensor, layer_routing: LayerRouting | None = None) -> torch.Tensor:
        output = nn.functional.linear(hidden_states, self.weight, self.bias)
        routing = layer_routing.routing if layer_routing is not None else None
        flat = hidden_states.reshape(-1, self.in_features)
        token_index = routing.token_index if routing is not None else None
        if token_index is not None:  # padding tokens are not routed: the base linear alone
            token_index = token_index.to(flat.device)
            flat = flat.index_select(0, token_index)
        logits, weights, index = self.route(flat)
        codes = self.expert_codes(flat)
        # (tokens, E): gate × alpha / r for the chosen experts, zero for the others
        gates = torch.zeros(codes.shape[:2], dtype=codes.dtype, device=codes.device)
        gates = gates.scatter(1, index, (weights * self.scaling).to(codes.dtype))
        if routing is not None and routing.contrastive:  # every expert compared, for the loss only
            anchor = torch.randint(self.top_k, (flat.shape[0],), device=flat.device)
            similarities = expert_similarities(codes, self.lora_B)
            layer_routing.aux.contrastive_losses.append(
                contrastive_expert_loss(similarities, index, anchor, self.tau, self.eps)
            )
        if layer_routing is not None:
            layer_routing.aux.router_logits.append(logits)
            layer_routing.aux.expert_counts.append(torch.bincount(index.reshape(-1), minlength=self.num_experts))
        # Σ_i gate_i · B_i (A_i x): the gated codes times the stacked B, one matmul added into the output
        gated = (codes * gates.unsqueeze(-1)).flatten(1).to(output.dtype)
        flat_b = self.lora_B.transpose(1, 2).reshape(self.num_experts * self.rank, self.out_features)
        flat_output = output.view(-1, self.out_features)
        if token_index is None:
            flat_output.addmm_(gated, flat_b.to(output.dtype))
        else:
            flat_output.index_add_(0, token_index, gated @ flat_b.to(output.dtype))
        return output

    def delta_weight(self, expert_weights: torch.Tensor) -> torch.Tensor:
        """`Σ_i w_i · (alpha / r) · B_i A_i` `(out, in)` in float64: the experts folded into one update of
        `weight`, each weighted by `expert_weights` `(E,)` (for instance its mean routing weight on
        calibration texts, the expected gate). Routing depends on the input, so a merge approximates the
        routed linear; with one expert it is exact."""
        delta = torch.einsum("e,eor,eri->oi", expert_weights.double(), self.lora_B.double(), self.lora_A.double())
        return self.scaling * delta

    def merged_weight(self, expert_weights: torch.Tensor) -> torch.Tensor:
        """`weight + delta_weight(expert_weights)`, in the dtype of `weight`: the dense linear of a merge."""
        return (self.weight.double() + self.delta_weight(expert_weights)).to(self.weight.dtype)


__all__ = [
    "ADAPTER_SUFFIXES",
    "CoMoeLayerAux",
    "CoMoeLinear",
    "CoMoeRouter",
    "CoMoeRouting",
    "LayerRouting",
    "contrastive_expert_loss",
    "cosine_from_gram",
    "expert_similarities",
    "is_adapter_key",
    "top_k_gates",
]
