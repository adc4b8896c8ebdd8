"""The shared BERT-compatible encoder used by every model type of this package.

Parameter names are those of transformers' `BertModel` (`embeddings.*`,
`encoder.layer.N.attention.self.query`, ...), so `bert`, `roberta` and `xlm-roberta` checkpoints
load without renaming except in the layers a model type replaces. A model type plugs in its own
layer class for the layers that hold experts (see `EncoderStack`); everything else is written once
here.

Saved model folders carry this file inlined into their code: it imports only torch and public transformers names.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .compat import attention_function, create_bidirectional_mask, is_exporting
from .configuration_encoder import EncoderConfig


@dataclass
class EncoderBackboneOutput(BaseModelOutputWithPooling):
    r"""
    Output of the shared encoder (`EncoderPreTrainedModel.forward_backbone`), before a model type
    adds its own fields.

    layer_aux (`tuple`):
        The auxiliary output of each layer that produced one, in layer order (token-routed MoE: the
        router logits of each MoE layer; empty for MoTE and dense layers).
    """

    layer_aux: tuple | None = None


class EncoderEmbeddings(nn.Module):
    """Word + absolute position + token type embeddings, then LayerNorm and dropout (BERT)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_offset = config.position_offset

    def forward(self, input_ids, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        seq_length = inputs_embeds.shape[1]
        if position_ids is None and self.position_offset + seq_length > self.position_embeddings.num_embeddings:
            positions = self.position_embeddings.num_embeddings - self.position_offset
            raise ValueError(
                f"Input of {seq_length} tokens is longer than the {positions} "
                "positions this model has; truncate it (tokenizer(..., truncation=True))"
            )
        # Positions are computed, not kept in a buffer: models are built on the meta device by
        # `from_pretrained`, and a computed range cannot be left uninitialised.
        if position_ids is None:
            position_ids = torch.arange(
                self.position_offset, self.position_offset + seq_length, device=inputs_embeds.device
            ).unsqueeze(0)
        if token_type_ids is None:
            # Type 0 for every token: add the row instead of embedding a tensor of zeros.
            embeddings = inputs_embeds + self.token_type_embeddings.weight[0]
        else:
            embeddings = inputs_embeds + self.token_type_embeddings(token_type_ids)
        # Same summation order as BertEmbeddings, so upcycled models match the dense one bit for bit.
        embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
):
    """Plain softmax attention; `attention_mask` is additive. Returns `(output, weights)`."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (batch, heads, seq, seq)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (batch, seq, heads, head_dim)
    return output, weights


def project(linear: nn.Module, hidden_states: torch.Tensor, routing=None) -> torch.Tensor:
    """A projection of a layer: `linear(hidden_states)`, or, for a linear that reads the layer's routing
    (`takes_routing = True`: CoMoE's routed LoRA experts), `linear(hidden_states, routing)`. The routing travels as
    an argument from the layer to its linears, so concurrent forward passes never share it."""
    return linear(hidden_states, routing) if getattr(linear, "takes_routing", False) else linear(hidden_states)


class EncoderSelfAttention(nn.Module):
    """Multi-head self-attention through transformers' attention interface (sdpa, eager, ...)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, hidden_states, attention_mask=None, routing=None, **kwargs):
        batch, seq, _ = hidden_states.shape
        shape = (batch, seq, -1, self.head_dim)
        query = project(self.query, hidden_states, routing).view(shape).transpose(1, 2)  # (batch, heads, seq, dim)
        key = project(self.key, hidden_states, routing).view(shape).transpose(1, 2)
        value = project(self.value, hidden_states, routing).view(shape).transpose(1, 2)
        attention: Callable = attention_function(self.config._attn_implementation, eager_attention_forward)
        output, weights = attention(
            self,
            query,
            key,
            value,
            attention_mask,
            dropout=self.dropout_p if self.training else 0.0,
            scaling=self.scaling,
            is_causal=False,
            **kwargs,
        )
        return output.reshape(batch, seq, -1), weights


class EncoderSelfOutput(nn.Module):
    """Attention output projection, dropout, residual and (unless an expert owns it) LayerNorm."""

    def __init__(self, config: EncoderConfig, with_norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        if with_norm:
            self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.with_norm = with_norm

    def forward(self, hidden_states, input_tensor, routing=None):
        hidden_states = self.dropout(project(self.dense, hidden_states, routing)) + input_tensor
        return self.LayerNorm(hidden_states) if self.with_norm else hidden_states


class EncoderAttention(nn.Module):
    """`attention.self` + `attention.output`, as in BERT."""

    def __init__(self, config: EncoderConfig, with_norm: bool = True):
        super().__init__()
        self.self = EncoderSelfAttention(config)
        self.output = EncoderSelfOutput(config, with_norm=with_norm)

    def forward(self, hidden_states, attention_mask=None, routing=None, **kwargs):
        attended, weights = self.self(hidden_states, attention_mask, routing, **kwargs)
        return self.output(attended, hidden_states, routing), weights


class EncoderIntermediate(nn.Module):
    """First feed-forward projection and activation."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]

    def forward(self, hidden_states, routing=None):
        return self.intermediate_act_fn(project(self.dense, hidden_states, routing))


class EncoderOutput(nn.Module):
    """Second feed-forward projection, dropout, residual and LayerNorm."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, input_tensor, routing=None):
        return self.LayerNorm(self.dropout(project(self.dense, hidden_states, routing)) + input_tensor)


class EncoderLayer(GradientCheckpointingLayer):
    """A dense post-LN BERT layer. Expert layers subclass it and override `feed_forward`.

    `routing` is whatever the model type computed once per forward pass (MoTE: the row segments of
    each task; token MoE: which tokens are not padding; CoMoE: which tokens are not padding and where its
    linears report); dense layers ignore it. It reaches `feed_forward` and, through `project`, every projection
    of the layer whose linear reads it. `feed_forward`
    returns the layer output and an auxiliary output (token MoE: router logits) or `None`.
    """

    attention_norm_in_layer = True

    def __init__(self, config: EncoderConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.attention = EncoderAttention(config, with_norm=self.attention_norm_in_layer)
        self.build_feed_forward(config)

    def build_feed_forward(self, config: EncoderConfig) -> None:
        """Create the feed-forward parameters (BERT's `intermediate` and `output`)."""
        self.intermediate = EncoderIntermediate(config)
        self.output = EncoderOutput(config)

    def feed_forward(self, attention_output: torch.Tensor, routing):
        """Feed-forward block on the attention output `(batch, seq, hidden)`: `(output, aux)`."""
        return self.output(self.intermediate(attention_output, routing), attention_output, routing), None

    def forward(self, hidden_states, attention_mask=None, routing=None, **kwargs):
        attention_output, weights = self.attention(hidden_states, attention_mask, routing, **kwargs)
        output, aux = self.feed_forward(attention_output, routing)
        return output, weights, aux


class EncoderStack(nn.Module):
    """`encoder.layer.N`: dense layers, with `expert_layer_cls` at the indices in `expert_layers`."""

    def __init__(self, config: EncoderConfig, expert_layer_cls: type | None = None, expert_layers=()):
        super().__init__()
        expert_layers = set(expert_layers)
        self.layer = nn.ModuleList(
            (expert_layer_cls if i in expert_layers else EncoderLayer)(config, layer_idx=i)
            for i in range(config.num_hidden_layers)
        )

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        routing=None,
        output_hidden_states=False,
        output_attentions=False,
        **kwargs,
    ) -> EncoderBackboneOutput:
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_aux = ()
        for layer in self.layer:
            hidden_states, weights, aux = layer(hidden_states, attention_mask, routing, **kwargs)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)
            if aux is not None:
                all_aux += (aux,)
        return EncoderBackboneOutput(
            last_hidden_state=hidden_states, hidden_states=all_hidden, attentions=all_attentions, layer_aux=all_aux
        )


class EncoderPooler(nn.Module):
    """BERT's pooler: dense + tanh on the first token."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class EncoderPreTrainedModel(PreTrainedModel):
    """Base of every model of this package: weight init, attention backends, checkpointing."""

    config_class = EncoderConfig
    base_model_prefix = "encoder_model"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_attention_backend = True
    _no_split_modules = ["EncoderEmbeddings", "EncoderLayer"]

    def build_encoder(self, expert_layer_cls: type | None = None, expert_layers=()) -> None:
        """Create `embeddings`, `encoder` (with `expert_layer_cls` at `expert_layers`) and `pooler`."""
        self.embeddings = EncoderEmbeddings(self.config)
        self.encoder = EncoderStack(self.config, expert_layer_cls, expert_layers)
        self.pooler = EncoderPooler(self.config) if self.config.add_pooling_layer else None

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @staticmethod
    def real_token_index(input_ids, inputs_embeds, attention_mask):
        """`(attention_mask, token_index)` for models that route tokens: `token_index` holds the flat
        indices (into `batch * seq`) of the real, non-padding tokens, the ones a router sees (`None`:
        every token is real). The mask becomes `None` when nothing is padded (decided once here, not
        again when the attention mask is built).

        Raises:
            ValueError: for an empty batch.
        """
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is not None and reference.shape[0] == 0:
            raise ValueError("Got an empty batch: `input_ids` has 0 rows")
        if attention_mask is None:
            return None, None
        if not is_exporting() and bool(attention_mask.all()):  # a graph keeps the mask: the next batch may pad
            return None, None
        return attention_mask, attention_mask.reshape(-1).nonzero().squeeze(-1)

    def forward_backbone(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        routing=None,
        output_hidden_states=None,
        output_attentions=None,
    ) -> EncoderBackboneOutput:
        """Run the embeddings, the layer stack (with `routing` for expert layers) and the pooler.

        The padding mask is turned into each attention backend's format by transformers'
        `create_bidirectional_mask` (`None` when nothing is padded, so sdpa takes its fastest kernel).
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_attentions and self.config._attn_implementation == "sdpa":
            raise ValueError("`output_attentions=True` needs `attn_implementation='eager'`; sdpa returns no weights")
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden, attention_mask=attention_mask)
        stack = self.encoder(
            hidden, mask, routing, output_hidden_states=output_hidden_states, output_attentions=output_attentions
        )
        return EncoderBackboneOutput(
            last_hidden_state=stack.last_hidden_state,
            pooler_output=self.pooler(stack.last_hidden_state) if self.pooler is not None else None,
            hidden_states=stack.hidden_states,
            attentions=stack.attentions,
            layer_aux=stack.layer_aux,
        )


__all__ = [
    "EncoderEmbeddings",
    "EncoderSelfAttention",
    "EncoderAttention",
    "EncoderIntermediate",
    "EncoderOutput",
    "EncoderLayer",
    "EncoderStack",
    "EncoderPooler",
    "EncoderPreTrainedModel",
    "EncoderBackboneOutput",
]
