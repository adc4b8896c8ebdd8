"""The shared encoder used by every model type of this package, for every base it upcycles.

Parameter names are those of transformers' `BertModel` (`embeddings.*`, `encoder.layer.N.attention.self.query`,
...), so `bert`, `roberta` and `xlm-roberta` checkpoints load without renaming except in the layers a model type
replaces; the other bases' checkpoints are renamed into these names by one table (`convert/bases.py`). What differs
between bases is a handful of config fields (`EncoderConfig`): absolute or rotary positions, local (windowed)
attention in some layers, a relative position bias (MPNet), post- or pre-LayerNorm layers (`prenorm`: ModernBERT's
`attention_norm`, `feed_forward_norm` and final norm), a gated feed-forward block, biases or none. A model type plugs
in its own layer class for the layers that hold experts (see `EncoderStack`); everything else is written once here.

Saved model folders carry this file inlined into their code: it imports only torch and public transformers names.
"""

import math
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


def layer_norm(config: EncoderConfig) -> nn.LayerNorm:
    """A LayerNorm of the hidden size, with a bias where the base's norms have one (`norm_bias`)."""
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.norm_bias)


class EncoderEmbeddings(nn.Module):
    """Word embeddings, plus absolute position and token type embeddings where the base has them, then LayerNorm
    and dropout (BERT; MPNet has no token types, ModernBERT neither positions nor types)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        if config.position_embedding_type == "absolute":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.position_offset = config.position_offset
        self.absolute = config.position_embedding_type == "absolute"
        self.has_token_types = config.type_vocab_size > 0

    def forward(self, input_ids, token_type_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds
        if self.has_token_types:
            if token_type_ids is None:
                # Type 0 for every token: add the row instead of embedding a tensor of zeros.
                embeddings = embeddings + self.token_type_embeddings.weight[0]
            else:
                embeddings = embeddings + self.token_type_embeddings(token_type_ids)
        if self.absolute:
            # Same summation order as BertEmbeddings, so upcycled models match the dense one bit for bit.
            embeddings = embeddings + self.position_embeddings(self.absolute_positions(position_ids, inputs_embeds))
        return self.dropout(self.LayerNorm(embeddings))

    def absolute_positions(self, position_ids, inputs_embeds) -> torch.Tensor:
        """`position_ids`, or the positions of an unpadded row (from `position_offset`, RoBERTa's and MPNet's
        padding index + 1). Computed, not kept in a buffer: models are built on the meta device by `from_pretrained`,
        and a computed range cannot be left uninitialised.

        Raises:
            ValueError: for an input longer than the table.
        """
        if position_ids is not None:
            return position_ids
        seq_length, table = inputs_embeds.shape[1], self.position_embeddings.num_embeddings
        if self.position_offset + seq_length > table:
            raise ValueError(
                f"Input of {seq_length} tokens is longer than the {table - self.position_offset} "
                "positions this model has; truncate it (tokenizer(..., truncation=True))"
            )
        offset = self.position_offset
        return torch.arange(offset, offset + seq_length, device=inputs_embeds.device).unsqueeze(0)


@dataclass(frozen=True)
class LayerAttention:
    """What a layer's attention reads besides the hidden states, built once per forward pass for each kind of layer
    (global, local): the mask in the attention backend's format (a relative position bias folded in) and the rotary
    tables `(cos, sin)`, each `(batch or 1, seq, head_size)` (`None`: absolute positions)."""

    mask: torch.Tensor | None
    rotary: tuple[torch.Tensor, torch.Tensor] | None = None


def rotary_tables(positions: torch.Tensor, head_size: int, base: float, dtype: torch.dtype):
    """`(cos, sin)` of rotary position embeddings (the non-interleaved form: each frequency on dims `i` and
    `i + head_size / 2`) for `positions` `(batch or 1, seq)`, computed in fp32."""
    exponents = torch.arange(0, head_size, 2, dtype=torch.float, device=positions.device) / head_size
    inverse_frequencies = 1.0 / (base**exponents)
    angles = positions[..., None].float() * inverse_frequencies  # (batch, seq, head_size / 2)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(states: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `states` `(batch, heads, seq, head_size)` by the tables of `rotary_tables`, in fp32."""
    half = states.shape[-1] // 2
    x = states.float()
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)).to(states.dtype)


def relative_position_bucket(relative: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket of each relative position (key minus query), bidirectional: half the buckets for each direction,
    exact distances below a quarter of the buckets, logarithmically wider buckets up to `max_distance`, beyond which
    every distance shares the last bucket (MPNet's, T5's bidirectional scheme)."""
    half = num_buckets // 2
    distance = -relative
    bucket = (distance < 0).long() * half
    distance = distance.abs()
    exact = half // 2
    # the logarithm only where it is used: a distance of 0 would make it -inf, which no integer holds
    far = distance.clamp(min=exact).float()
    scaled = torch.log(far / exact) / math.log(max_distance / exact) * (half - exact)
    wide = (exact + scaled.long()).clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, wide)


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
    """Multi-head self-attention through transformers' attention interface (sdpa, eager, ...), with rotary
    positions where the base has them (`LayerAttention.rotary`)."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        self.head_dim = config.head_size
        self.scaling = self.head_dim**-0.5
        self.is_causal = False
        self.query = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.key = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.value = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout_p = config.attention_probs_dropout_prob

    def forward(self, hidden_states, attention: LayerAttention | None = None, routing=None, **kwargs):
        batch, seq, _ = hidden_states.shape
        shape = (batch, seq, -1, self.head_dim)
        query = project(self.query, hidden_states, routing).view(shape).transpose(1, 2)  # (batch, heads, seq, dim)
        key = project(self.key, hidden_states, routing).view(shape).transpose(1, 2)
        value = project(self.value, hidden_states, routing).view(shape).transpose(1, 2)
        if attention is not None and attention.rotary is not None:
            query, key = apply_rotary(query, *attention.rotary), apply_rotary(key, *attention.rotary)
        function: Callable = attention_function(self.config._attn_implementation, eager_attention_forward)
        output, weights = function(
            self,
            query,
            key,
            value,
            attention.mask if attention is not None else None,
            dropout=self.dropout_p if self.training else 0.0,
            scaling=self.scaling,
            is_causal=False,
            **kwargs,
        )
        return output.reshape(batch, seq, -1), weights


class EncoderSelfOutput(nn.Module):
    """Attention output projection, dropout, residual and (post-LN, unless an expert owns it) LayerNorm."""

    def __init__(self, config: EncoderConfig, with_norm: bool = True):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        with_norm = with_norm and not config.prenorm
        if with_norm:
            self.LayerNorm = layer_norm(config)
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

    def forward(self, hidden_states, attention=None, routing=None, residual=None, **kwargs):
        """Attention over `hidden_states`, added to `residual` (default: `hidden_states`; a pre-norm layer passes
        its stream before the norm)."""
        attended, weights = self.self(hidden_states, attention, routing, **kwargs)
        return self.output(attended, hidden_states if residual is None else residual, routing), weights


class EncoderIntermediate(nn.Module):
    """First feed-forward projection and activation; in a gated block (`gated_mlp`, GLU) the projection has twice the
    width, and its first half, activated, multiplies the second."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        width = config.intermediate_size * (2 if config.gated_mlp else 1)
        self.dense = nn.Linear(config.hidden_size, width, bias=config.mlp_bias)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]
        self.gated = config.gated_mlp

    def forward(self, hidden_states, routing=None):
        projected = project(self.dense, hidden_states, routing)
        if self.gated:
            activated, gate = projected.chunk(2, dim=-1)
            return self.intermediate_act_fn(activated) * gate
        return self.intermediate_act_fn(projected)


class EncoderOutput(nn.Module):
    """Second feed-forward projection, dropout, residual and (post-LN) LayerNorm."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)
        if not config.prenorm:
            self.LayerNorm = layer_norm(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.prenorm = config.prenorm

    def forward(self, hidden_states, input_tensor, routing=None):
        output = self.dropout(project(self.dense, hidden_states, routing)) + input_tensor
        return output if self.prenorm else self.LayerNorm(output)


class EncoderLayer(GradientCheckpointingLayer):
    """A dense layer: BERT's post-LN layer, or a pre-norm one (`config.prenorm`: the attention reads
    `attention_norm` of the stream, the feed-forward block `feed_forward_norm` of it, and each adds its output to
    the stream). Expert layers subclass it and override `build_feed_forward` / `feed_forward`.

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
        self.attention_kind = config.attention_kind(layer_idx)
        self.prenorm = config.prenorm
        first = layer_idx == 0 and not config.first_layer_attention_norm
        self.attention_norm = layer_norm(config) if config.prenorm and not first else None
        self.attention = EncoderAttention(config, with_norm=self.attention_norm_in_layer)
        self.build_feed_forward(config)

    def build_feed_forward(self, config: EncoderConfig) -> None:
        """Create the feed-forward parameters (BERT's `intermediate` and `output`; before them a pre-norm layer's
        `feed_forward_norm`)."""
        self.feed_forward_norm = layer_norm(config) if config.prenorm else None
        self.intermediate = EncoderIntermediate(config)
        self.output = EncoderOutput(config)

    def feed_forward(self, attention_output: torch.Tensor, routing):
        """Feed-forward block on the attention output `(batch, seq, hidden)`: `(output, aux)`."""
        inputs = self.feed_forward_norm(attention_output) if self.prenorm else attention_output
        return self.output(self.intermediate(inputs, routing), attention_output, routing), None

    def forward(self, hidden_states, attention: LayerAttention | None = None, routing=None, **kwargs):
        normed = self.attention_norm(hidden_states) if self.attention_norm is not None else hidden_states
        attention_output, weights = self.attention(normed, attention, routing, residual=hidden_states, **kwargs)
        output, aux = self.feed_forward(attention_output, routing)
        return output, weights, aux


class EncoderStack(nn.Module):
    """`encoder.layer.N`: dense layers, with `expert_layer_cls` at the indices in `expert_layers`; the relative
    position bias the layers share (`relative_attention_bias`, MPNet's) and a pre-norm stack's `final_norm`."""

    def __init__(self, config: EncoderConfig, expert_layer_cls: type | None = None, expert_layers=()):
        super().__init__()
        expert_layers = set(expert_layers)
        self.layer = nn.ModuleList(
            (expert_layer_cls if i in expert_layers else EncoderLayer)(config, layer_idx=i)
            for i in range(config.num_hidden_layers)
        )
        if config.relative_attention_num_buckets:
            self.relative_attention_bias = nn.Embedding(
                config.relative_attention_num_buckets, config.num_attention_heads
            )
        self.final_norm = layer_norm(config) if config.prenorm else None
        self.buckets = config.relative_attention_num_buckets, config.relative_attention_max_distance

    def position_bias(self, positions: torch.Tensor) -> torch.Tensor:
        """`(batch or 1, heads, seq, seq)`: the relative position bias of `positions` `(batch or 1, seq)`."""
        relative = positions[:, None, :] - positions[:, :, None]  # key minus query
        bias = self.relative_attention_bias(relative_position_bucket(relative, *self.buckets))
        return bias.permute(0, 3, 1, 2)

    def forward(
        self,
        hidden_states,
        attention: dict[str, LayerAttention] | None = None,
        routing=None,
        output_hidden_states=False,
        output_attentions=False,
        **kwargs,
    ) -> EncoderBackboneOutput:
        """`attention`: what each kind of layer's attention reads (`EncoderPreTrainedModel.attention_inputs`)."""
        all_hidden = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_aux = ()
        for layer in self.layer:
            inputs = attention[layer.attention_kind] if attention is not None else None
            hidden_states, weights, aux = layer(hidden_states, inputs, routing, **kwargs)
            if output_hidden_states:
                all_hidden += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)
            if aux is not None:
                all_aux += (aux,)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
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


def windowed_mask(config, hidden, attention_mask, positions, window: int | None, bias: torch.Tensor | None):
    """The attention mask of a local layer (keys at most `window` positions away) or of a layer with a relative
    position bias, in the backend's format: boolean for sdpa without a bias, else additive (the bias added);
    `None` where nothing is masked and nothing added."""
    keep = None
    if attention_mask is not None and (is_exporting() or not bool(attention_mask.all())):
        keep = attention_mask.bool()[:, None, None, :]  # (batch, 1, 1, key)
    if window is not None:
        near = ((positions[:, :, None] - positions[:, None, :]).abs() <= window)[:, None]  # (batch, 1, query, key)
        keep = near if keep is None else keep & near
    if bias is None and config._attn_implementation == "sdpa":
        return keep
    if keep is None:
        return bias
    dtype = hidden.dtype
    additive = torch.zeros(keep.shape, dtype=dtype, device=hidden.device).masked_fill(~keep, torch.finfo(dtype).min)
    return additive if bias is None else additive + bias


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

    def attention_inputs(self, hidden, attention_mask, position_ids) -> dict[str, LayerAttention]:
        """What the attention of each kind of layer reads, once per forward pass. For a global layer without a
        position bias, the padding mask in each backend's format is transformers' own `create_bidirectional_mask`
        (`None` when nothing is padded, so sdpa takes its fastest kernel); a local layer's window and MPNet's bias
        are measured on the positions the embeddings read (`position_ids` less `position_offset`, else `0..seq-1`),
        so a prefix hidden by `prefix_routes_only` is not counted. Rotary tables where positions are rotary."""
        config = self.config
        kinds = {config.attention_kind(layer) for layer in range(config.num_hidden_layers)}
        rotary = config.position_embedding_type == "rotary"
        has_bias = config.relative_attention_num_buckets > 0
        if not (rotary or has_bias or "local" in kinds):
            mask = create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)
            return {"global": LayerAttention(mask)}
        if position_ids is not None:
            positions = position_ids - config.position_offset
        else:
            positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        bias = self.encoder.position_bias(positions) if has_bias else None
        inputs = {}
        for kind in sorted(kinds):
            local = kind == "local"
            if local or bias is not None:
                window = config.local_attention // 2 if local else None
                mask = windowed_mask(config, hidden, attention_mask, positions, window, bias)
            else:
                mask = create_bidirectional_mask(config=config, inputs_embeds=hidden, attention_mask=attention_mask)
            base = (config.local_rotary_emb_base or config.rotary_emb_base) if local else config.rotary_emb_base
            tables = rotary_tables(positions, config.head_size, base, hidden.dtype) if rotary else None
            inputs[kind] = LayerAttention(mask, tables)
        return inputs

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
        """Run the embeddings, the layer stack (with `routing` for expert layers) and the pooler; what the attention
        reads is built once (`attention_inputs`)."""
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`")
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        if output_attentions is None:
            output_attentions = self.config.output_attentions
        if output_attentions and self.config._attn_implementation == "sdpa":
            raise ValueError("`output_attentions=True` needs `attn_implementation='eager'`; sdpa returns no weights")
        hidden = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds)
        attention = self.attention_inputs(hidden, attention_mask, position_ids)
        stack = self.encoder(
            hidden, attention, routing, output_hidden_states=output_hidden_states, output_attentions=output_attentions
        )
        return EncoderBackboneOutput(
            last_hidden_state=stack.last_hidden_state,
            pooler_output=self.pooler(stack.last_hidden_state) if self.pooler is not None else None,
            hidden_states=stack.hidden_states,
            attentions=stack.attentions,
            layer_aux=stack.layer_aux,
        )


__all__ = [
    "LayerAttention",
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
