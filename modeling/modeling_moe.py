"""Token-routed sparse MoE encoder, as in Nomic Embed v2 (Nussbaum & Duderstadt, 2025, "Training
Sparse Mixture Of Experts Text Embedding Models").

Every `config.moe_layers` layer replaces BERT's feed-forward block (`intermediate.dense`,
`output.dense`) with `num_local_experts` experts and a router; each non-padding token goes to its
top-`num_experts_per_tok` experts by softmax router probability. The attention-output and output
LayerNorms stay shared. Experts are stacked 3-D parameters so that transformers' experts
implementations (`experts_implementation="grouped_mm"` / `"batched_mm"`) apply; `"eager"` is the
loop in `MoeBertExperts.forward`, correct on any torch. When the caller names none, each call runs the
fastest one measured for the device of its inputs (`FASTEST_EXPERTS`), chosen where the experts are called and
written nowhere: `model.get_experts_implementation()` shows the one for the device the model sits on.

The model returns the Switch-style load-balancing loss (and optionally the router z-loss, both in
`router_losses.py`) as `aux_loss`; add it to the training loss (see `training/losses.py`).
"""

from dataclasses import dataclass

import torch
from torch import nn
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .compat import ALL_EXPERTS_FUNCTIONS, OutputRecorder, init, is_exporting, use_experts_implementation
from .configuration_moe import MoeBertConfig
from .modeling_encoder import EncoderLayer, EncoderPreTrainedModel, EncoderSelfAttention, layer_norm
from .router_losses import load_balancing_loss, router_z_loss

# The experts implementation a model runs when the caller names none, per device type: on CPU the eager loop,
# the fastest at every batch and length of `benchmarks/bench_moe.py` (docs/benchmarks.md); elsewhere
# transformers' own default, `grouped_mm`.
FASTEST_EXPERTS = {"cpu": "eager"}
DEFAULT_EXPERTS = "grouped_mm"


def fastest_experts(device: torch.device) -> str:
    """The experts implementation run on `device` when the caller names none."""
    return FASTEST_EXPERTS.get(torch.device(device).type, DEFAULT_EXPERTS)


class MoeBertExpertsInterface:
    """Where `MoeBertExperts` finds the function it runs, given the config's `experts_implementation`: a named one
    in transformers' table (`ALL_EXPERTS_FUNCTIONS`, as every transformers MoE), none named (`None`) the fastest
    for the device of each call's inputs. The choice is made per call from the call's own inputs, so nothing is
    written while a batch runs and a model split over devices (`device_map`) runs each layer's fastest."""

    def get_interface(self, implementation: str | None, eager):
        if implementation is not None:
            return ALL_EXPERTS_FUNCTIONS.get_interface(implementation, eager)

        def fastest(experts, hidden_states, *args, **kwargs):
            chosen = ALL_EXPERTS_FUNCTIONS.get_interface(fastest_experts(hidden_states.device), eager)
            return chosen(experts, hidden_states, *args, **kwargs)

        return fastest


@dataclass
class MoeBertModelOutput(BaseModelOutputWithPooling):
    r"""
    Output of [`MoeBertModel`].

    aux_loss (`torch.FloatTensor` of shape `()`):
        `router_aux_loss_coef * load_balancing_loss + router_z_loss_coef * z_loss`, averaged over MoE layers.
    router_logits (`tuple[torch.FloatTensor]`, *optional*, returned when `output_router_logits=True`):
        One `(num_tokens, num_local_experts)` fp32 tensor per MoE layer, over non-padding tokens in
        row-major order.
    """

    aux_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None


@dataclass(frozen=True)
class MoeRouting:
    """Flat indices of the non-padding tokens of a batch (`None`: no padding)."""

    token_index: torch.LongTensor | None


class MoeBertRouter(nn.Module):
    """`Linear(hidden, num_local_experts, bias=False)` in fp32, softmax, top-`top_k` (renormalised when
    `norm_topk_prob`): `(router_logits, top_k_weights, top_k_index)`.

    The interface of transformers' `*TopKRouter` classes (OLMoE, Qwen-MoE, Mixtral, ...): `top_k` is read
    at every forward, so tools that reallocate experts (`aea.py`) treat this encoder like those models.
    """

    def __init__(self, config: MoeBertConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))
        self.jitter_noise = config.router_jitter_noise
        self.top_k = config.num_experts_per_tok
        self.norm_topk_prob = config.norm_topk_prob

    def forward(self, hidden_states: torch.Tensor):
        # fp32 even under autocast (bf16 training), where a plain linear would be recast.
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            hidden_states = hidden_states.float()
            if self.training and self.jitter_noise > 0:
                noise = torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)
                hidden_states = hidden_states * noise
            router_logits = nn.functional.linear(hidden_states, self.weight.float())  # (tokens, experts)
            weights, selected = torch.topk(torch.softmax(router_logits, dim=-1), self.top_k, dim=-1)
            if self.norm_topk_prob:
                weights = weights / weights.sum(dim=-1, keepdim=True)
        return router_logits, weights, selected


class MoeBertExpertsLoop(nn.Module):
    """The experts' own implementations, the eager loop and the graph-safe one, for every kind of expert: each
    subclass holds the stacked parameters and says what expert `index` computes on its rows, `expert(inputs,
    index)`."""

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """Eager implementation: routing slots sorted by expert, one gather, two matmuls per expert hit.

        hidden_states `(tokens, hidden)`, top_k_index / top_k_weights `(tokens, k)`.
        """
        num_tokens, num_top_k = top_k_index.shape
        flat_experts = top_k_index.reshape(-1)  # (tokens * k,) slot -> expert
        order = torch.argsort(flat_experts, stable=True)
        counts = torch.bincount(flat_experts, minlength=self.num_experts).tolist()  # one host sync
        sorted_inputs = hidden_states.index_select(0, order // num_top_k)  # (slots, hidden), grouped by expert
        sorted_outputs = torch.empty_like(sorted_inputs)
        start = 0
        for expert, count in enumerate(counts):
            if count == 0:
                continue
            end = start + count
            sorted_outputs[start:end] = self.expert(sorted_inputs[start:end], expert)
            start = end
        slot_outputs = torch.empty_like(sorted_outputs)
        slot_outputs[order] = sorted_outputs  # back to (token, slot) order
        weighted = slot_outputs.view(num_tokens, num_top_k, hidden_states.shape[-1]) * top_k_weights.unsqueeze(-1)
        return weighted.sum(dim=1)  # deterministic reduction over the k slots of each token

    def graph_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        """Graph-safe implementation, used whenever the model is traced (`torch.onnx.export`, `torch.export`): each
        expert gathers its `(token, slot)` pairs found by tensor ops and adds its weighted output back, with
        no host sync and no `histc`/sort-out ops, whatever `experts_implementation` says."""
        output = torch.zeros_like(hidden_states)
        for expert in range(self.num_experts):
            token, slot = (top_k_index == expert).nonzero(as_tuple=True)
            out = self.expert(hidden_states.index_select(0, token), expert)
            output = output.index_add(0, token, out * top_k_weights[token, slot].unsqueeze(-1))
        return output


@use_experts_implementation(has_gate=False, has_bias=True, experts_interface=MoeBertExpertsInterface())
class MoeBertExperts(MoeBertExpertsLoop):
    """`num_local_experts` BERT feed-forward blocks stored as stacked parameters.

    `up_proj` `(E, intermediate, hidden)` and `down_proj` `(E, hidden, intermediate)` have the layout
    of `nn.Linear` weights, so a dense `intermediate.dense` / `output.dense` pair stacks into them.
    """

    def __init__(self, config: MoeBertConfig):
        super().__init__()
        self.num_experts = config.num_local_experts
        self.up_proj = nn.Parameter(torch.empty(config.num_local_experts, config.intermediate_size, config.hidden_size))
        self.up_proj_bias = nn.Parameter(torch.empty(config.num_local_experts, config.intermediate_size))
        self.down_proj = nn.Parameter(
            torch.empty(config.num_local_experts, config.hidden_size, config.intermediate_size)
        )
        self.down_proj_bias = nn.Parameter(torch.empty(config.num_local_experts, config.hidden_size))
        self.act_fn = ACT2FN[config.hidden_act]

    def expert(self, inputs: torch.Tensor, index: int) -> torch.Tensor:
        h = nn.functional.linear(inputs, self.up_proj[index], self.up_proj_bias[index])
        return nn.functional.linear(self.act_fn(h), self.down_proj[index], self.down_proj_bias[index])


@use_experts_implementation(has_gate=True, has_bias=False, experts_interface=MoeBertExpertsInterface())
class MoeBertGatedExperts(MoeBertExpertsLoop):
    """`num_local_experts` gated feed-forward blocks (GLU, no biases: ModernBERT's) stored as stacked parameters:
    `gate_up_proj` `(E, 2 * intermediate, hidden)`, whose first half is activated and multiplies the second (the
    layout of transformers' MoE experts, and of a dense `intermediate.dense` of a gated block), and `down_proj`
    `(E, hidden, intermediate)`."""

    def __init__(self, config: MoeBertConfig):
        super().__init__()
        self.num_experts = config.num_local_experts
        self.gate_up_proj = nn.Parameter(
            torch.empty(config.num_local_experts, 2 * config.intermediate_size, config.hidden_size)
        )
        self.down_proj = nn.Parameter(
            torch.empty(config.num_local_experts, config.hidden_size, config.intermediate_size)
        )
        self.act_fn = ACT2FN[config.hidden_act]

    def expert(self, inputs: torch.Tensor, index: int) -> torch.Tensor:
        activated, gate = nn.functional.linear(inputs, self.gate_up_proj[index]).chunk(2, dim=-1)
        return nn.functional.linear(self.act_fn(activated) * gate, self.down_proj[index])


class MoeBertSparseBlock(nn.Module):
    """Router and experts: `(tokens, hidden) -> (tokens, hidden), router logits`."""

    def __init__(self, config: MoeBertConfig):
        super().__init__()
        self.router = MoeBertRouter(config)
        self.experts = (MoeBertGatedExperts if config.gated_mlp else MoeBertExperts)(config)

    def forward(self, hidden_states: torch.Tensor):
        router_logits, weights, selected = self.router(hidden_states)  # fp32
        weights = weights.to(hidden_states.dtype)
        if is_exporting():
            return self.experts.graph_forward(hidden_states, selected, weights), router_logits
        return self.experts(hidden_states, selected, weights), router_logits


class MoeBertOutputNorm(nn.Module):
    """Dropout, residual and (post-LN) `output.LayerNorm` after the experts (the layer's `output` without `dense`)."""

    def __init__(self, config: MoeBertConfig):
        super().__init__()
        if not config.prenorm:
            self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.prenorm = config.prenorm

    def forward(self, hidden_states, input_tensor):
        output = self.dropout(hidden_states) + input_tensor
        return output if self.prenorm else self.LayerNorm(output)


class MoeBertLayer(EncoderLayer):
    """A layer whose feed-forward block is a token-routed sparse MoE block (`mlp`); a pre-norm layer keeps its
    `feed_forward_norm`, shared by the experts."""

    def build_feed_forward(self, config: MoeBertConfig) -> None:
        self.feed_forward_norm = layer_norm(config) if config.prenorm else None
        self.mlp = MoeBertSparseBlock(config)
        self.output = MoeBertOutputNorm(config)

    def feed_forward(self, attention_output: torch.Tensor, routing: MoeRouting):
        batch, seq, hidden = attention_output.shape
        inputs = self.feed_forward_norm(attention_output) if self.prenorm else attention_output
        flat = inputs.reshape(-1, hidden)
        if routing.token_index is None:
            moe_out, router_logits = self.mlp(flat)
        else:  # padding tokens are neither routed nor counted; their FFN output is zero
            token_index = routing.token_index.to(flat.device)  # layers may sit on several devices
            routed, router_logits = self.mlp(flat.index_select(0, token_index))
            moe_out = torch.zeros_like(flat).index_copy(0, token_index, routed)
        return self.output(moe_out.view(batch, seq, hidden), attention_output), router_logits


class MoeBertPreTrainedModel(EncoderPreTrainedModel):
    """Base class of token-routed MoE models: config class and initialisation of expert parameters."""

    config_class = MoeBertConfig
    _no_split_modules = ["EncoderEmbeddings", "EncoderLayer", "MoeBertLayer"]
    # The modules whose outputs hold router logits and attention probabilities, named as transformers'
    # MoE models name theirs, so that tools built on that interface (`aea.py`) find them.
    _can_record_outputs = {
        "router_logits": OutputRecorder(MoeBertRouter, index=0),
        "attentions": OutputRecorder(EncoderSelfAttention, index=1),
    }

    def get_correct_experts_implementation(self, requested_experts: str | None) -> str | None:
        """transformers 5.x asks this at construction and on `set_experts_implementation`: a named
        implementation is checked by transformers and kept; none named stays `None` in the config, which
        `MoeBertExpertsInterface` reads as "the fastest for the device of the inputs", call by call."""
        if requested_experts is None:
            return None
        return super().get_correct_experts_implementation(requested_experts)

    def get_experts_implementation(self) -> dict[str, str | None]:
        """transformers' answer, with the implementation this model runs where none was named: the fastest for
        the device its parameters sit on (a model moved to another device runs that device's)."""
        found = super().get_experts_implementation()
        if found.get("") is None:
            found[""] = fastest_experts(self.device)
        return found

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, MoeBertExperts):
            init.normal_(module.up_proj, mean=0.0, std=std)
            init.normal_(module.down_proj, mean=0.0, std=std)
            init.zeros_(module.up_proj_bias)
            init.zeros_(module.down_proj_bias)
        elif isinstance(module, MoeBertGatedExperts):
            init.normal_(module.gate_up_proj, mean=0.0, std=std)
            init.normal_(module.down_proj, mean=0.0, std=std)
        elif isinstance(module, MoeBertRouter):
            init.normal_(module.weight, mean=0.0, std=std)


class MoeBertModel(MoeBertPreTrainedModel):
    """BERT encoder with token-routed sparse MoE blocks in `config.moe_layers`.

    Example:

    ```python
    >>> model = AutoModel.from_pretrained("models/moe-minilm", trust_remote_code=True, experts_implementation="eager")
    >>> out = model(**tokenizer(["search_query: who was newton?"], return_tensors="pt"))
    >>> out.last_hidden_state, out.aux_loss
    ```
    """

    def __init__(self, config: MoeBertConfig):
        super().__init__(config)
        self.build_encoder(MoeBertLayer, config.moe_layers)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        output_router_logits: bool | None = None,
        return_dict: bool | None = None,
    ) -> MoeBertModelOutput | tuple:
        r"""
        output_router_logits (`bool`, *optional*): Return each MoE layer's router logits
            (defaults to `config.output_router_logits`).
        return_dict (`bool`, *optional*): `False` returns a tuple instead of a `MoeBertModelOutput`.
        """
        attention_mask, token_index = self.real_token_index(input_ids, inputs_embeds, attention_mask)
        backbone = self.forward_backbone(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            routing=MoeRouting(token_index),
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        router_logits, device = backbone.layer_aux, backbone.last_hidden_state.device  # one per MoE layer
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        # an inference graph has no loss to return (and the loss's empty-batch branch is not graph-safe)
        exporting_for_inference = is_exporting() and not self.training
        output = MoeBertModelOutput(
            last_hidden_state=backbone.last_hidden_state,
            pooler_output=backbone.pooler_output,
            hidden_states=backbone.hidden_states,
            attentions=backbone.attentions,
            aux_loss=None if exporting_for_inference else self.aux_loss_from_layer_aux(router_logits, device),
            router_logits=router_logits if output_router_logits else None,
        )
        return output if return_dict is not False else output.to_tuple()

    def aux_loss_from_layer_aux(self, router_logits: tuple[torch.Tensor, ...], device: torch.device) -> torch.Tensor:
        """The output's `aux_loss` computed from what the layer stack returned (`layer_aux`: here each MoE
        layer's router logits, `(non-padding tokens, experts)`), on `device`:
        `router_aux_loss_coef · load balancing + router_z_loss_coef · z-loss`, averaged over the MoE layers."""
        config = self.config  # with a device map, MoE layers may sit on several devices
        loss = (
            config.router_aux_loss_coef
            * torch.stack(
                [load_balancing_loss(logits, config.num_experts_per_tok).to(device) for logits in router_logits]
            ).mean()
        )
        if config.router_z_loss_coef:
            z_losses = [router_z_loss(logits).to(device) for logits in router_logits]
            loss = loss + config.router_z_loss_coef * torch.stack(z_losses).mean()
        return loss


__all__ = [
    "FASTEST_EXPERTS",
    "fastest_experts",
    "MoeBertExpertsInterface",
    "MoeBertModel",
    "MoeBertPreTrainedModel",
    "MoeBertLayer",
    "MoeBertSparseBlock",
    "MoeBertExperts",
    "MoeBertGatedExperts",
    "MoeBertExpertsLoop",
    "MoeBertRouter",
    "MoeBertModelOutput",
]
