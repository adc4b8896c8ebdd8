"""Configuration of CoMoE-PEFT: LoRA experts with top-k routing on a frozen encoder, trained with a
contrastive loss between activated and inactivated experts (Feng et al., 2025, "CoMoE: Contrastive
Representation for Mixture-of-Experts in Parameter-Efficient Fine-tuning")."""

import os

from .configuration_encoder import EncoderConfig, check_top_k, resolve_layer_indices
from .defaults import COMOE

# The linears of a BERT layer that can carry LoRA experts, by their name inside the layer, in the
# order a forward pass calls them.
ADAPTABLE_LINEARS = (
    "attention.self.query",
    "attention.self.key",
    "attention.self.value",
    "attention.output.dense",
    "intermediate.dense",
    "output.dense",
)
DEFAULT_TARGET_MODULES = tuple(COMOE.target_modules.split(","))


def resolve_target_modules(spec) -> list[str]:
    """Names (as in `ADAPTABLE_LINEARS`) of the linears that `spec` selects, in forward order.

    `spec` is a list of names or a comma-separated string. A name selects every adaptable linear it
    equals or ends with after a dot, the rule of peft's `LoraConfig(target_modules=[...])`, so the
    same list selects the same linears in a peft LoRA baseline (`"output.dense"` selects both
    `attention.output.dense` and the feed-forward `output.dense`, as in peft).

    Raises:
        ValueError: for an empty spec or a name that selects no linear, listing the valid names.
    """
    names = [part.strip() for part in spec.split(",")] if isinstance(spec, str) else list(spec)
    names = [name for name in names if name]
    if not names or any(not isinstance(name, str) for name in names):
        raise ValueError(f"`target_modules` must name at least one linear, got {spec!r}")
    selected = set()
    for name in names:
        matches = {full for full in ADAPTABLE_LINEARS if full == name or full.endswith("." + name)}
        if not matches:
            short = ", ".join(["query", "key", "value", *ADAPTABLE_LINEARS[3:]])
            raise ValueError(f"unknown target module {name!r}; expected names of BERT layer linears: {short}")
        selected |= matches
    return [full for full in ADAPTABLE_LINEARS if full in selected]


class CoMoeBertConfig(EncoderConfig):
    r"""
    Configuration of [`CoMoeBertModel`]: a frozen BERT encoder in which every target linear of every
    adapter layer gets `num_local_experts` LoRA experts and a per-token router that picks
    `num_experts_per_tok` of them: `y = W x + b + Σ_{i ∈ top-k} g_i · (lora_alpha / lora_rank) · B_i A_i x`
    with `g` the router's softmax renormalised over the chosen experts. All fields of
    [`EncoderConfig`] apply.

    Args:
        num_local_experts (`int`, *optional*, defaults to 4): LoRA experts per target linear.
        num_experts_per_tok (`int`, *optional*, defaults to 2): Experts each token uses (top-k).
        lora_rank (`int`, *optional*, defaults to 16): Rank `r` of every expert.
        lora_alpha (`float`, *optional*, defaults to 32): LoRA scaling numerator; experts are scaled by
            `lora_alpha / lora_rank`.
        lora_dropout (`float`, *optional*, defaults to 0.05): Dropout on the experts' input in training.
        target_modules (`list[str]` or `str`, *optional*, defaults to `query,key,value,attention.output.dense`):
            Linears that get experts, matched as peft's `target_modules` (see `resolve_target_modules`).
            Stored resolved, as full names inside a layer.
        adapter_layers (`list[int]` or `str`, *optional*, defaults to `"all"`): Layers whose target
            linears get experts: `"all"`, `"every_other"` or explicit indices. Stored resolved.
        contrastive_loss_coef (`float`, *optional*, defaults to 0.01): Weight λ of the contrastive expert
            loss (paper, Algorithm 1), computed only in training. 0 gives MoE-LoRA.
        contrastive_tau (`float`, *optional*, defaults to 0.07): Temperature τ of that loss (the paper
            gives no value; 0.07 is InfoNCE's usual one).
        contrastive_eps (`float`, *optional*, defaults to 1e-3): The ε in the loss's denominator (paper: 1e-3).
        router_aux_loss_coef (`float`, *optional*, defaults to 0.0): Weight of the Switch load-balancing
            loss of every router (off, as in the paper).
        output_router_logits (`bool`, *optional*, defaults to `False`): Return every router's logits.
        base_model_name_or_path (`str`, *optional*): The dense model the adapters were made for (a Hub id
            or a local folder); an adapter-only folder loads its base weights from it.
    """

    model_type = "comoe_bert"

    num_local_experts: int = COMOE.num_local_experts
    num_experts_per_tok: int = COMOE.num_experts_per_tok
    lora_rank: int = COMOE.lora_rank
    lora_alpha: float = COMOE.lora_alpha
    lora_dropout: float = COMOE.lora_dropout
    target_modules: list[str] | str = COMOE.target_modules
    adapter_layers: list[int] | str = COMOE.adapter_layers
    contrastive_loss_coef: float = COMOE.contrastive_loss_coef
    contrastive_tau: float = COMOE.contrastive_tau
    contrastive_eps: float = COMOE.contrastive_eps
    router_aux_loss_coef: float = COMOE.router_aux_loss_coef
    output_router_logits: bool = False
    base_model_name_or_path: str | None = None

    def __setattr__(self, key, value):
        # a path given as `os.PathLike` (`from_pretrained(..., base_model_name_or_path=Path(...))`, which
        # `AutoConfig` sets on the config) is kept as the string a `config.json` can hold
        if key == "base_model_name_or_path" and isinstance(value, os.PathLike):
            value = os.fspath(value)
        super().__setattr__(key, value)

    def __post_init__(self, **kwargs):
        check_top_k(self.num_local_experts, self.num_experts_per_tok)
        if self.lora_rank < 1:
            raise ValueError(f"`lora_rank` must be a positive integer, got {self.lora_rank}")
        if self.lora_alpha <= 0:
            raise ValueError(f"`lora_alpha` must be positive, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"`lora_dropout` must lie in [0, 1), got {self.lora_dropout}")
        if self.contrastive_loss_coef < 0 or self.router_aux_loss_coef < 0:
            raise ValueError("`contrastive_loss_coef` and `router_aux_loss_coef` must be >= 0")
        if self.contrastive_loss_coef > 0 and self.num_experts_per_tok < 2:
            raise ValueError(
                "the contrastive expert loss needs num_experts_per_tok >= 2 (its positives are the other "
                "activated experts); set contrastive_loss_coef=0 for top-1 routing"
            )
        if self.contrastive_tau <= 0 or self.contrastive_eps < 0:
            raise ValueError("`contrastive_tau` must be positive and `contrastive_eps` non-negative")
        self.target_modules = resolve_target_modules(self.target_modules)
        self.adapter_layers = resolve_layer_indices(self.adapter_layers, self.num_hidden_layers, "adapter_layers")
        super().__post_init__(**kwargs)

    @property
    def lora_scaling(self) -> float:
        """`lora_alpha / lora_rank`, the factor of every expert's output."""
        return self.lora_alpha / self.lora_rank

    def adapted_linears(self) -> list[str]:
        """Full names of the linears with experts (`encoder.layer.N.attention.self.query`, ...), in the
        order of the model's router outputs."""
        return [f"encoder.layer.{layer}.{name}" for layer in self.adapter_layers for name in self.target_modules]


__all__ = ["CoMoeBertConfig", "resolve_target_modules", "ADAPTABLE_LINEARS", "DEFAULT_TARGET_MODULES"]
