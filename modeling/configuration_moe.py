"""Configuration of the token-routed sparse MoE encoder (Nomic Embed v2, Nussbaum & Duderstadt, 2025)."""

from .configuration_encoder import EncoderConfig, check_top_k, resolve_layer_indices
from .defaults import MOE


class MoeBertConfig(EncoderConfig):
    r"""
    Configuration of [`MoeBertModel`]: a BERT encoder whose MoE layers route every token to its
    top-`num_experts_per_tok` of `num_local_experts` feed-forward experts. All fields of
    [`EncoderConfig`] apply.

    Args:
        num_local_experts (`int`, *optional*, defaults to 8): Experts per MoE layer.
        num_experts_per_tok (`int`, *optional*, defaults to 2): Experts each token is sent to (top-k).
        norm_topk_prob (`bool`, *optional*, defaults to `False`): Renormalise the selected experts'
            softmax weights to sum to 1. With identical experts this makes the layer equal the dense FFN.
        moe_layers (`list[int]` or `str`, *optional*, defaults to `"every_other"`): Layers whose FFN is an
            MoE block: `"every_other"` (1, 3, 5, ...: every other layer starting with the second, as in the
            paper), `"all"`, or explicit indices. Stored resolved, as a list.
        router_aux_loss_coef (`float`, *optional*, defaults to 1.0): Weight α of the load-balancing loss
            (the paper uses 1).
        router_z_loss_coef (`float`, *optional*, defaults to 0.0): Weight of the router z-loss (ST-MoE).
        router_jitter_noise (`float`, *optional*, defaults to 0.0): In training, router inputs are
            multiplied by noise drawn from U(1 - ε, 1 + ε) (Switch Transformer); 0 disables it.
        output_router_logits (`bool`, *optional*, defaults to `False`): Return each MoE layer's router
            logits in the output.
    """

    model_type = "moe_bert"

    num_local_experts: int = MOE.num_local_experts
    num_experts_per_tok: int = MOE.num_experts_per_tok
    norm_topk_prob: bool = MOE.norm_topk_prob
    moe_layers: list[int] | str = MOE.moe_layers
    router_aux_loss_coef: float = MOE.router_aux_loss_coef
    router_z_loss_coef: float = MOE.router_z_loss_coef
    router_jitter_noise: float = MOE.router_jitter_noise
    output_router_logits: bool = False

    def __post_init__(self, **kwargs):
        check_top_k(self.num_local_experts, self.num_experts_per_tok)
        if self.gated_mlp == self.mlp_bias:
            raise ValueError(
                "token-routed experts are plain feed-forward blocks with biases (BERT, MPNet) or gated ones without "
                f"(ModernBERT); got gated_mlp={self.gated_mlp}, mlp_bias={self.mlp_bias}"
            )
        if not 0.0 <= self.router_jitter_noise < 1.0:
            raise ValueError(f"`router_jitter_noise` must lie in [0, 1), got {self.router_jitter_noise}")
        self.moe_layers = resolve_layer_indices(self.moe_layers, self.num_hidden_layers, "moe_layers")
        super().__post_init__(**kwargs)


__all__ = ["MoeBertConfig"]
