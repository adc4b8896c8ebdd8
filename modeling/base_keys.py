"""How each base's checkpoint keys map onto the shared encoder's (BERT's names, `modeling_encoder.py`), one table per
`model_type`: the converters read it (`convert/bases.py`, which describes the rest of each base), and so does a CoMoE
adapter-only folder, which loads its base's weights when it is loaded.

A key is renamed by the first rule whose template its start matches (`{n}` a layer index), the rest of the key
(`weight`, `bias`) kept; a rule with several targets splits the tensor into equal chunks along dim 0 (a fused
`Wqkv` into query, key and value, as transformers' own conversion of `nomic_bert` does) and the way back
concatenates them. A key no rule matches keeps its name (BERT, RoBERTa and XLM-R need no rule). Task-head
checkpoints (`BertForMaskedLM`, ...) keep the encoder under a prefix (`bert.`, `model.`), which is stripped; what is
not part of the encoder afterwards (heads) is dropped.

Saved model folders carry this file inlined into their code: it imports only the standard library and torch.
"""

import re
from dataclasses import dataclass

import torch

# the roots of the shared encoder's keys; anything else in a dense checkpoint is a head
ENCODER_ROOTS = ("embeddings.", "encoder.", "pooler.")


@dataclass(frozen=True)
class Rename:
    """A key prefix of the base's checkpoint (`theirs`, `{n}` a layer index) and the prefix(es) of the shared
    encoder it becomes (`ours`; several: the tensor's equal chunks along dim 0)."""

    theirs: str
    ours: tuple[str, ...]


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{n\}", r"(\d+)") + "(.+)$")


def _fill(template: str, match: re.Match) -> str:
    *layer, rest = match.groups()
    return template.format(n=layer[0] if layer else "") + rest


@dataclass(frozen=True)
class KeyLayout:
    """A base's key renames and the prefixes of its task-head checkpoints."""

    renames: tuple[Rename, ...] = ()
    head_prefixes: tuple[str, ...] = ("bert.", "roberta.", "model.")

    def our_keys(self, key: str) -> list[str]:
        """The shared encoder's key(s) of a key of the base's checkpoint (after any head prefix)."""
        for rule in self.renames:
            match = _pattern(rule.theirs).match(key)
            if match:
                return [_fill(ours, match) for ours in rule.ours]
        return [key]

    def their_key(self, key: str) -> tuple[str, int, int] | None:
        """`(base key, chunk index, chunks)` of a shared-encoder key some rule renames, else `None`."""
        for rule in self.renames:
            for index, ours in enumerate(rule.ours):
                match = _pattern(ours).match(key)
                if match:
                    return _fill(rule.theirs, match), index, len(rule.ours)
        return None

    def to_ours(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """`(the shared encoder's state dict, the keys dropped)` of the base's checkpoint: head prefixes stripped,
        keys renamed, fused tensors split, heads and saved buffers dropped."""
        ours, dropped = {}, []
        for key, tensor in state.items():
            bare = next((key[len(prefix) :] for prefix in self.head_prefixes if key.startswith(prefix)), key)
            if bare.endswith(("position_ids", "token_type_ids")):
                continue  # buffers some old checkpoints saved
            names = self.our_keys(bare)
            if not names[0].startswith(ENCODER_ROOTS):
                dropped.append(key)
                continue
            chunks = tensor.chunk(len(names), dim=0) if len(names) > 1 else (tensor,)
            ours.update({name: chunk.contiguous() for name, chunk in zip(names, chunks, strict=True)})
        return ours, dropped

    def to_theirs(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base's own state dict (its model class's names, no head prefix) of a shared-encoder state dict:
        renamed back, split tensors concatenated.

        Raises:
            ValueError: where a part of a split tensor is missing.
        """
        theirs, parts = {}, {}
        for key, tensor in state.items():
            target = self.their_key(key)
            if target is None:
                theirs[key] = tensor
                continue
            name, index, count = target
            parts.setdefault(name, [None] * count)[index] = tensor
            if all(part is not None for part in parts[name]):
                theirs[name] = torch.cat(parts.pop(name))
        if parts:
            raise ValueError(f"incomplete fused tensors {sorted(parts)}: a part of each is missing")
        return theirs


BERT_KEYS = KeyLayout()
MPNET_KEYS = KeyLayout(
    renames=(
        Rename("encoder.layer.{n}.attention.attn.q.", ("encoder.layer.{n}.attention.self.query.",)),
        Rename("encoder.layer.{n}.attention.attn.k.", ("encoder.layer.{n}.attention.self.key.",)),
        Rename("encoder.layer.{n}.attention.attn.v.", ("encoder.layer.{n}.attention.self.value.",)),
        Rename("encoder.layer.{n}.attention.attn.o.", ("encoder.layer.{n}.attention.output.dense.",)),
        Rename("encoder.layer.{n}.attention.LayerNorm.", ("encoder.layer.{n}.attention.output.LayerNorm.",)),
    ),
    head_prefixes=("mpnet.",),
)
MODERNBERT_KEYS = KeyLayout(
    renames=(
        Rename("embeddings.tok_embeddings.", ("embeddings.word_embeddings.",)),
        Rename("embeddings.norm.", ("embeddings.LayerNorm.",)),
        Rename("layers.{n}.attn_norm.", ("encoder.layer.{n}.attention_norm.",)),
        Rename(
            "layers.{n}.attn.Wqkv.",
            (
                "encoder.layer.{n}.attention.self.query.",
                "encoder.layer.{n}.attention.self.key.",
                "encoder.layer.{n}.attention.self.value.",
            ),
        ),
        Rename("layers.{n}.attn.Wo.", ("encoder.layer.{n}.attention.output.dense.",)),
        Rename("layers.{n}.mlp_norm.", ("encoder.layer.{n}.feed_forward_norm.",)),
        Rename("layers.{n}.mlp.Wi.", ("encoder.layer.{n}.intermediate.dense.",)),
        Rename("layers.{n}.mlp.Wo.", ("encoder.layer.{n}.output.dense.",)),
        Rename("final_norm.", ("encoder.final_norm.",)),
    ),
    head_prefixes=("model.",),
)
# dense model_type -> its key layout
KEY_LAYOUTS = {
    "bert": BERT_KEYS,
    "roberta": BERT_KEYS,
    "xlm-roberta": BERT_KEYS,
    "mpnet": MPNET_KEYS,
    "modernbert": MODERNBERT_KEYS,
}


__all__ = [
    "ENCODER_ROOTS",
    "Rename",
    "KeyLayout",
    "KEY_LAYOUTS",
    "BERT_KEYS",
    "MPNET_KEYS",
    "MODERNBERT_KEYS",
]
