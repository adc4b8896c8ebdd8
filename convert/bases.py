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
| NomicBERT | nomic_bert | rotary | post-LN | SwiGLU, no biases (v1, v1.5, nomic-bert-2048); MLP with biases (v2) |
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from moe_embed.errors import UsageError
from moe_embed.modeling.base_keys import BERT_KEYS, MODERNBERT_KEYS, MPNET_KEYS, NOMIC_BERT_KEYS, KeyLayout

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
    # the config transformers' class of the base needs for a checkpoint whose config.json it misreads (the Hub's
    # NomicBERT configs), else None: transformers reads config.json itself
    reference_config: Callable = staticmethod(lambda config: None)

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

# NomicBERT's config comes in two namings: the Hub's checkpoints (contrastors' `NomicBertConfig`, GPT-2's field
# names: `n_embd`, `activation_function`, bias and rotary switches), which transformers 5's `NomicBertConfig` does
# not read (it takes them as unknown attributes and keeps its defaults), and transformers' own (`hidden_size`,
# `rope_parameters`; a SwiGLU block without biases is all its `NomicBertModel` computes). The Hub's names are read
# where present; exports write both, so that transformers, the Hub's remote code and the serving engines' converters
# (llama.cpp's `convert_hf_to_gguf.py`, TEI, vLLM) read the same folder.
NOMIC_GATED = {"swiglu": "silu", "geglu": "gelu", "glu": "sigmoid"}  # the Hub's gated activations -> act of the gate
# the Hub's switches this encoder does not implement, with the only value it takes
NOMIC_FIXED = {
    "prenorm": False,
    "parallel_block": False,
    "causal": False,
    "rotary_emb_fraction": 1.0,
    "rotary_emb_interleaved": False,
    "rotary_emb_scale_base": None,
    "rotary_scaling_factor": None,
    "use_rms_norm": None,
}
NOMIC_KEPT = ("max_trained_positions",)  # kept from the source and written back (the encoder reads none)


def _nomic_hub(config, name: str, default=None):
    value = getattr(config, name, default)
    return default if value is None else value


def _nomic_fields(config) -> dict:
    if not hasattr(config, "n_embd"):  # transformers' own naming: SwiGLU without biases
        rope = config.rope_parameters or {}
        if rope.get("rope_type", "default") != "default":
            raise UsageError(f"rotary scaling {rope['rope_type']!r} is not supported; expected the default rotary")
        return {
            **{name: getattr(config, name) for name in BERT_FIELDS if name != "hidden_act"},
            "hidden_act": config.hidden_act,
            "pad_token_id": config.pad_token_id or 0,
            "position_embedding_type": "rotary",
            "rotary_emb_base": float(rope.get("rope_theta", config.default_theta)),
            "gated_mlp": True,
            "attention_bias": False,
            "mlp_bias": False,
        }
    for name, expected in NOMIC_FIXED.items():
        got = getattr(config, name, expected)
        if got != expected and not (expected is None and not got):
            raise UsageError(f"{name}={got!r} in a NomicBERT config is not supported; expected {expected!r}")
    activation = config.activation_function
    act = NOMIC_GATED.get(activation, activation)
    from transformers.activations import ACT2FN

    if act not in ACT2FN:
        raise UsageError(f"activation_function={activation!r} is not supported; expected swiglu, gelu, ...")
    fc1, fc2 = _nomic_hub(config, "mlp_fc1_bias", True), _nomic_hub(config, "mlp_fc2_bias", True)
    if fc1 != fc2:
        raise UsageError(f"mlp_fc1_bias={fc1} and mlp_fc2_bias={fc2} differ; expected both biases or neither")
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "intermediate_size": _nomic_hub(config, "n_inner", 4 * config.n_embd),
        "hidden_act": act,
        "hidden_dropout_prob": float(_nomic_hub(config, "resid_pdrop", 0.0)),
        "attention_probs_dropout_prob": float(_nomic_hub(config, "attn_pdrop", 0.0)),
        "max_position_embeddings": config.n_positions,
        "type_vocab_size": _nomic_hub(config, "type_vocab_size", 2),
        "initializer_range": _nomic_hub(config, "initializer_range", 0.02),
        "layer_norm_eps": _nomic_hub(config, "layer_norm_epsilon", 1e-5),
        "pad_token_id": _nomic_hub(config, "pad_token_id", 0),
        "position_embedding_type": "rotary",
        "rotary_emb_base": float(_nomic_hub(config, "rotary_emb_base", 10000.0)),
        "gated_mlp": activation in NOMIC_GATED,
        "attention_bias": _nomic_hub(config, "qkv_proj_bias", True),
        "mlp_bias": fc1,
        **{name: getattr(config, name) for name in NOMIC_KEPT if getattr(config, name, None) is not None},
    }


def _nomic_config(fields: dict) -> dict:
    gated = fields.get("gated_mlp", False)
    activation = (
        {act: name for name, act in NOMIC_GATED.items()}[fields["hidden_act"]] if gated else fields["hidden_act"]
    )
    return {
        # transformers' NomicBertConfig
        **{name: fields[name] for name in BERT_FIELDS if name in fields},
        "rope_parameters": {"rope_type": "default", "rope_theta": fields["rotary_emb_base"]},
        # the Hub's (contrastors') names, which its remote code and the serving engines' converters read
        "n_embd": fields["hidden_size"],
        "n_layer": fields["num_hidden_layers"],
        "n_head": fields["num_attention_heads"],
        "n_inner": fields["intermediate_size"],
        "n_positions": fields["max_position_embeddings"],
        "layer_norm_epsilon": fields["layer_norm_eps"],
        "activation_function": activation,
        "resid_pdrop": fields["hidden_dropout_prob"],
        "attn_pdrop": fields["attention_probs_dropout_prob"],
        "embd_pdrop": fields["hidden_dropout_prob"],
        "qkv_proj_bias": fields["attention_bias"],
        "mlp_fc1_bias": fields["mlp_bias"],
        "mlp_fc2_bias": fields["mlp_bias"],
        "rotary_emb_base": fields["rotary_emb_base"],
        **NOMIC_FIXED,
        **{name: fields[name] for name in NOMIC_KEPT if name in fields},
    }


def _nomic_reference_config(config):
    """transformers' `NomicBertConfig` of a Hub-named config (which transformers misreads), else `None`."""
    if not hasattr(config, "n_embd"):
        return None
    from transformers import NomicBertConfig

    return NomicBertConfig(**_nomic_config(_nomic_fields(config)))


NOMIC_BERT = Base(
    name="NomicBERT",
    architectures={"nomic_bert": "NomicBertModel"},
    read=_nomic_fields,
    write=_nomic_config,
    keys=NOMIC_BERT_KEYS,
    examples=("nomic-ai/nomic-embed-text-v1.5", "nomic-ai/nomic-bert-2048", "nomic-ai/nomic-embed-text-v1"),
    reference_config=_nomic_reference_config,
)

BASES = (BERT, MPNET, MODERNBERT, NOMIC_BERT)
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
    "NOMIC_BERT",
    "Base",
    "base_of",
    "architecture",
    "encoder_fields",
    "dense_fields",
    "BERT_FIELDS",
]
