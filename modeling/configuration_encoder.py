"""Configuration shared by every encoder of this package: BERT's fields, and the fields that describe the other bases
(positions, norm placement, gated feed-forward, biases).

Saved model folders carry this file inlined into their code, so it imports only the standard library and
public transformers names.
"""

import copy
import inspect

from transformers.activations import ACT2FN

from .compat import DATACLASS_CONFIGS, ConfigBase

POSITION_EMBEDDING_TYPES = ("absolute", "rotary")


def resolve_layer_indices(spec, num_hidden_layers: int, field_name: str) -> list[int]:
    """Turn a layer placement spec into a sorted list of layer indices.

    Args:
        spec (`str` or `list[int]`): `"all"`, `"every_other"` (layers 1, 3, 5, ...: every other layer
            starting with the second, as in Nomic Embed v2 and MoTE's EOB), a comma-separated string
            `"0,2,5"`, or a list of integers.
        num_hidden_layers (`int`): Number of layers of the encoder.
        field_name (`str`): Name of the config field, used in error messages.

    Raises:
        ValueError: if the spec is empty, malformed, repeats a layer or names a layer out of range.
    """
    if isinstance(spec, str):
        text = spec.strip()
        if text == "all":
            return list(range(num_hidden_layers))
        if text == "every_other":
            return list(range(1, num_hidden_layers, 2))
        try:
            spec = [int(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise ValueError(
                f"`{field_name}` must be 'all', 'every_other' or comma-separated layer indices, got {text!r}"
            ) from None
    indices = list(spec)
    if not indices:
        raise ValueError(f"`{field_name}` must name at least one layer, got an empty list")
    if any(not isinstance(i, int) or isinstance(i, bool) for i in indices):
        raise ValueError(f"`{field_name}` must hold integer layer indices, got {indices!r}")
    bad = [i for i in indices if not 0 <= i < num_hidden_layers]
    if bad:
        raise ValueError(
            f"`{field_name}` holds layer indices {bad} out of range for a model with "
            f"{num_hidden_layers} layers (valid: 0..{num_hidden_layers - 1})"
        )
    if len(set(indices)) != len(indices):
        raise ValueError(f"`{field_name}` repeats a layer index: {indices!r}")
    return sorted(indices)


def check_top_k(num_local_experts: int, num_experts_per_tok: int) -> None:
    """Raise `ValueError` unless there is at least one expert and `1 <= num_experts_per_tok <= num_local_experts`."""
    if num_local_experts < 1:
        raise ValueError(f"`num_local_experts` must be at least 1, got {num_local_experts}")
    if not 1 <= num_experts_per_tok <= num_local_experts:
        raise ValueError(
            f"`num_experts_per_tok` ({num_experts_per_tok}) must lie in 1..num_local_experts ({num_local_experts})"
        )


class EncoderConfig(ConfigBase):
    r"""
    Fields of the shared encoder: those of a post-LayerNorm BERT, named exactly as in transformers' `BertConfig`,
    and the fields that describe the other bases (MPNet, ModernBERT), whose defaults are BERT's. The model types of
    this package subclass it and add their expert fields.

    Args:
        vocab_size (`int`, *optional*, defaults to 30522): Size of the token vocabulary.
        hidden_size (`int`, *optional*, defaults to 768): Width of the hidden states.
        num_hidden_layers (`int`, *optional*, defaults to 12): Number of transformer layers.
        num_attention_heads (`int`, *optional*, defaults to 12): Attention heads per layer.
        intermediate_size (`int`, *optional*, defaults to 3072): Width of the feed-forward block.
        hidden_act (`str`, *optional*, defaults to `"gelu"`): Activation of the feed-forward block.
        hidden_dropout_prob (`float`, *optional*, defaults to 0.1): Dropout on hidden states.
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.1): Dropout on attention weights.
        max_position_embeddings (`int`, *optional*, defaults to 512): Number of absolute positions.
        type_vocab_size (`int`, *optional*, defaults to 2): Number of token type ids; 0: no token type embeddings.
        initializer_range (`float`, *optional*, defaults to 0.02): Std of the normal weight init.
        layer_norm_eps (`float`, *optional*, defaults to 1e-12): Epsilon of every LayerNorm.
        pad_token_id (`int`, *optional*, defaults to 0): Id of the padding token.
        position_offset (`int`, *optional*, defaults to 0): First position id. RoBERTa-family
            checkpoints number positions from `pad_token_id + 1`; BERT from 0.
        add_pooling_layer (`bool`, *optional*, defaults to `True`): Whether the model has BERT's
            `pooler` (dense + tanh on the first token).
        source_model_type (`str`, *optional*): `model_type` of the dense checkpoint this model was
            upcycled from (`bert`, `roberta`, `xlm-roberta`, `mpnet`, `modernbert`), kept for exports back to it.

    The fields below describe the bases beyond BERT; their defaults are BERT's, and `convert/bases.py` sets them
    from a dense checkpoint's config.

        position_embedding_type (`str`, *optional*, defaults to `"absolute"`): `"absolute"` (a learned table,
            `embeddings.position_embeddings`) or `"rotary"` (rotary embeddings on queries and keys: ModernBERT).
        rotary_emb_base (`float`, *optional*, defaults to 10000.0): Base (theta) of the rotary frequencies of the
            layers with global attention.
        local_attention (`int`, *optional*, defaults to 0): Window of the layers in `local_attention_layers`: a
            token attends to the tokens at most `local_attention // 2` positions away (ModernBERT's field). 0: none.
        local_attention_layers (`list[int]`, *optional*): Layers with local (windowed) attention; the others attend
            globally.
        local_rotary_emb_base (`float`, *optional*): Rotary base of the local layers (defaults to `rotary_emb_base`).
        relative_attention_num_buckets (`int`, *optional*, defaults to 0): Buckets of a relative position bias added
            to every layer's attention scores, one table shared by the layers (`encoder.relative_attention_bias`:
            MPNet's); 0: none.
        relative_attention_max_distance (`int`, *optional*, defaults to 128): Distance beyond which relative
            positions share the last bucket.
        prenorm (`bool`, *optional*, defaults to `False`): Pre-LayerNorm layers: each block normalises its input
            (`attention_norm`, `feed_forward_norm`) and adds its output to the unnormalised stream, which a final norm
            (`encoder.final_norm`) closes (ModernBERT); `False`: BERT's post-LayerNorm.
        first_layer_attention_norm (`bool`, *optional*, defaults to `True`): Whether the first pre-norm layer
            normalises its attention input (ModernBERT's does not: its embeddings end with a norm).
        gated_mlp (`bool`, *optional*, defaults to `False`): A gated feed-forward block (GLU): `intermediate.dense`
            has `2 * intermediate_size` outputs, the first half activated and multiplied by the second (ModernBERT).
        attention_bias (`bool`, *optional*, defaults to `True`): Whether the attention projections have biases.
        mlp_bias (`bool`, *optional*, defaults to `True`): Whether the feed-forward projections have biases.
        norm_bias (`bool`, *optional*, defaults to `True`): Whether the LayerNorms have biases.
    """

    model_type = "moe_embed_encoder"

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0
    position_offset: int = 0
    add_pooling_layer: bool = True
    source_model_type: str | None = None
    position_embedding_type: str = "absolute"
    rotary_emb_base: float = 10000.0
    local_attention: int = 0
    local_attention_layers: list[int] | None = None
    local_rotary_emb_base: float | None = None
    relative_attention_num_buckets: int = 0
    relative_attention_max_distance: int = 128
    prenorm: bool = False
    first_layer_attention_norm: bool = True
    gated_mlp: bool = False
    attention_bias: bool = True
    mlp_bias: bool = True
    norm_bias: bool = True

    if not DATACLASS_CONFIGS:

        def __init__(self, **kwargs):
            """transformers 4.x: the keyword `__init__` that 5.x derives from the annotated fields of this
            class and its subclasses (values from `kwargs`, else the class defaults), then `__post_init__`."""
            defaults = {}
            for klass in reversed(type(self).__mro__[: type(self).__mro__.index(EncoderConfig) + 1]):
                defaults.update({name: getattr(klass, name) for name in inspect.get_annotations(klass)})
            values = {name: kwargs.pop(name, copy.deepcopy(default)) for name, default in defaults.items()}
            ConfigBase.__init__(self, **kwargs)  # sets pad_token_id and friends first: ours win below
            for name, value in values.items():
                setattr(self, name, value)
            self.__post_init__()

    def __post_init__(self, **kwargs):
        if self.hidden_act not in ACT2FN:
            raise ValueError(f"Unknown hidden_act {self.hidden_act!r}; expected one of {sorted(ACT2FN)}")
        if self.hidden_size % self.num_attention_heads != 0:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be a multiple of num_attention_heads "
                f"({self.num_attention_heads})"
            )
        if self.position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(
                f"position_embedding_type must be one of {list(POSITION_EMBEDDING_TYPES)}, got "
                f"{self.position_embedding_type!r}"
            )
        if self.position_embedding_type == "rotary" and (self.hidden_size // self.num_attention_heads) % 2:
            raise ValueError("rotary positions need an even head size (hidden_size // num_attention_heads)")
        if self.local_attention < 0 or self.local_attention % 2:
            raise ValueError(f"`local_attention` must be an even window size >= 0, got {self.local_attention}")
        local = self.local_attention_layers or []
        if local:
            if not self.local_attention:
                raise ValueError("`local_attention_layers` needs a window: set `local_attention`")
            self.local_attention_layers = resolve_layer_indices(local, self.num_hidden_layers, "local_attention_layers")
        if self.relative_attention_num_buckets < 0 or self.relative_attention_num_buckets % 2:
            raise ValueError(
                f"`relative_attention_num_buckets` must be even and >= 0, got {self.relative_attention_num_buckets}"
            )
        if DATACLASS_CONFIGS:
            super().__post_init__(**kwargs)

    @property
    def head_size(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_attention_heads

    def attention_kind(self, layer: int) -> str:
        """`"local"` for a layer with windowed attention, else `"global"`."""
        return "local" if layer in (self.local_attention_layers or ()) else "global"


__all__ = ["EncoderConfig", "POSITION_EMBEDDING_TYPES", "resolve_layer_indices", "check_top_k"]
