"""The dense bases this package upcycles, each described once: which `model_type`s it covers, how its checkpoint
keys map onto the shared encoder's (`modeling/base_keys.py`, the one key table, which model folders carry too),
which encoder fields its config sets (positions, norm placement, gated feed-forward, biases, ...) and how an export
writes it back in its own architecture. Upcycling, merging, export and training read this table and nothing else
about a base; the model code reads only the encoder fields it sets.

| base | model types | positions | layers | feed-forward |
|---|---|---|---|---|
| BERT | bert, roberta, xlm-roberta | absolute (RoBERTa's from the padding index + 1) | post-LN | MLP |
| MPNet | mpnet | absolute, and a relative bias the layers share | post-LN | MLP |
| ModernBERT | modernbert | rotary; local windows in 2 of 3 layers | pre-LN, a final norm | GLU, no biases |
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from moe_embed.errors import UsageError
from moe_embed.modeling.base_keys import BERT_KEYS, MODERNBERT_KEYS, MPNET_KEYS, KeyLayout

logger = logging.getLogger(__name__)

# BERT's fields, copied from a dense BERT / RoBERTa / XLM-R / MPNet config into the encoder config (and back)
BERT_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "hidden_act",
    "hidden_dropout_prob",
    "attention_probs_dropout_prob",
    "max_position_embeddings",
    "type_vocab_size",
    "initializer_range",
    "layer_norm_eps",
    "pad_token_id",
)


@dataclass(frozen=True)
class Base:
    """One family of dense checkpoints (see the module docstring).

    `read(config)` turns the base's transformers config into encoder fields; `write(fields)` turns an encoder
    config (a dict, as `config.json` holds it) into the base's own config fields, for exports back to it.
    """

    name: str
    architectures: dict[str, str]
    read: Callable
    write: Callable
    keys: KeyLayout = BERT_KEYS
    pooler: bool = True  # its transformers class takes `add_pooling_layer`
    examples: tuple[str, ...] = ()

    def to_ours(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The shared encoder's state dict of the base's checkpoint (`KeyLayout.to_ours`; the heads dropped are
        logged)."""
        ours, dropped = self.keys.to_ours(state)
        if dropped:
            logger.info("dropping %d tensors that are not part of the encoder (heads): %s", len(dropped), dropped[:5])
        return ours

    def to_theirs(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base's own state dict of a shared-encoder state dict (`KeyLayout.to_theirs`)."""
        try:
            return self.keys.to_theirs(state)
        except ValueError as error:
            raise UsageError(str(error)) from None

    def our_key(self, key: str) -> list[str]:
        """The shared encoder's key(s) of one key of the base's model."""
        return self.keys.our_keys(key)


def _bert_fields(config) -> dict:
    fields = {name: getattr(config, name) for name in BERT_FIELDS}
    # RoBERTa and XLM-R number positions from the padding index + 1, BERT from 0
    pad = 1 if config.pad_token_id is None else config.pad_token_id
    fields["position_offset"] = 0 if config.model_type == "bert" else pad + 1
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise UsageError(
            f"position_embedding_type={config.position_embedding_type!r} is not supported; expected 'absolute'"
        )
    return fields


def _bert_config(fields: dict) -> dict:
    return {name: fields[name] for name in BERT_FIELDS if name in fields}


BERT = Base(
    name="BERT",
    architectures={"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"},
    read=_bert_fields,
    write=_bert_config,
    examples=("sentence-transformers/all-MiniLM-L6-v2", "BAAI/bge-small-en-v1.5", "intfloat/multilingual-e5-small"),
)


def _mpnet_fields(config) -> dict:
    fields = {name: getattr(config, name) for name in BERT_FIELDS if name != "type_vocab_size"}
    # MPNet's embeddings number positions from their padding index + 1, and that index is 1 whatever the config
    # says (`MPNetEmbeddings.padding_idx`); it has no token types
    return {
        **fields,
        "type_vocab_size": 0,
        "position_offset": 2,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
    }


def _mpnet_config(fields: dict) -> dict:
    config = {name: fields[name] for name in BERT_FIELDS if name in fields and name != "type_vocab_size"}
    return {**config, "relative_attention_num_buckets": fields["relative_attention_num_buckets"]}


MPNET = Base(
    name="MPNet",
    architectures={"mpnet": "MPNetModel"},
    read=_mpnet_fields,
    write=_mpnet_config,
    keys=MPNET_KEYS,
    examples=("sentence-transformers/all-mpnet-base-v2", "sentence-transformers/multi-qa-mpnet-base-dot-v1"),
)


def _rope_theta(config, kind: str) -> float:
    rope = config.rope_parameters[kind]
    if rope.get("rope_type", "default") != "default":
        raise UsageError(
            f"rotary scaling {rope['rope_type']!r} is not supported; expected the default rotary positions"
        )
    return float(rope["rope_theta"])


# kept from the source and written back on export (the encoder reads none of them)
MODERNBERT_TOKEN_IDS = ("bos_token_id", "eos_token_id", "cls_token_id", "sep_token_id")


def _modernbert_fields(config) -> dict:
    local = [layer for layer, kind in enumerate(config.layer_types) if kind == "sliding_attention"]
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": config.hidden_activation,
        "hidden_dropout_prob": float(config.mlp_dropout),
        "attention_probs_dropout_prob": float(config.attention_dropout),
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": 0,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "rotary",
        "rotary_emb_base": _rope_theta(config, "full_attention"),
        "local_attention": config.local_attention if local else 0,
        "local_attention_layers": local or None,
        "local_rotary_emb_base": _rope_theta(config, "sliding_attention") if local else None,
        "prenorm": True,
        "first_layer_attention_norm": False,
        "gated_mlp": True,
        "attention_bias": config.attention_bias,
        "mlp_bias": config.mlp_bias,
        "norm_bias": config.norm_bias,
        **{name: getattr(config, name) for name in MODERNBERT_TOKEN_IDS},
    }


def _modernbert_config(fields: dict) -> dict:
    local = set(fields.get("local_attention_layers") or ())
    layers = range(fields["num_hidden_layers"])
    local_base = fields.get("local_rotary_emb_base") or fields["rotary_emb_base"]
    return {
        **{name: fields[name] for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")},
        "intermediate_size": fields["intermediate_size"],
        "hidden_activation": fields["hidden_act"],
        "mlp_dropout": fields["hidden_dropout_prob"],
        "attention_dropout": fields["attention_probs_dropout_prob"],
        "max_position_embeddings": fields["max_position_embeddings"],
        "initializer_range": fields["initializer_range"],
        "norm_eps": fields["layer_norm_eps"],
        "pad_token_id": fields["pad_token_id"],
        "layer_types": ["sliding_attention" if layer in local else "full_attention" for layer in layers],
        "local_attention": fields.get("local_attention") or 128,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": fields["rotary_emb_base"]},
            "sliding_attention": {"rope_type": "default", "rope_theta": local_base},
        },
        **{name: fields[name] for name in ("attention_bias", "mlp_bias", "norm_bias")},
        **{name: fields[name] for name in MODERNBERT_TOKEN_IDS if name in fields},
    }


MODERNBERT = Base(
    name="ModernBERT",
    architectures={"modernbert": "ModernBertModel"},
    read=_modernbert_fields,
    write=_modernbert_config,
    keys=MODERNBERT_KEYS,
    pooler=False,
    examples=("Alibaba-NLP/gte-modernbert-base", "nomic-ai/modernbert-embed-base", "answerdotai/ModernBERT-base"),
)

BASES = (BERT, MPNET, MODERNBERT)
# model_type of a dense checkpoint -> its base
BASE_OF = {model_type: base for base in BASES for model_type in base.architectures}


def base_of(model_type: str | None, where: str = "config.json") -> Base:
    """The base of a dense `model_type`.

    Raises:
        UsageError: naming every model type this package upcycles, for any other.
    """
    if model_type not in BASE_OF:
        raise UsageError(
            f"unsupported architecture model_type={model_type!r} in {where}; expected one of {', '.join(BASE_OF)}"
        )
    return BASE_OF[model_type]


def architecture(model_type: str) -> str:
    """The transformers class a dense `model_type` is saved as (`BertModel`, `MPNetModel`, ...)."""
    return base_of(model_type).architectures[model_type]


def encoder_fields(config) -> dict:
    """The shared encoder's fields of a dense transformers config (`source_model_type` included)."""
    return {**base_of(config.model_type).read(config), "source_model_type": config.model_type}


def dense_fields(fields: dict) -> tuple[str, dict]:
    """`(model_type, transformers config fields)` of the dense model an encoder config (as `config.json` holds it)
    was upcycled from, for exports back to it."""
    model_type = fields.get("source_model_type") or "bert"
    return model_type, base_of(model_type, "the folder's source_model_type").write(fields)


__all__ = [
    "BASES",
    "BASE_OF",
    "BERT",
    "MPNET",
    "MODERNBERT",
    "Base",
    "base_of",
    "architecture",
    "encoder_fields",
    "dense_fields",
    "BERT_FIELDS",
]
