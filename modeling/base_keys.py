"""How each base's checkpoint keys map onto the shared encoder's (BERT's names, `modeling_encoder.py`), one table per
`model_type`: the converters read it (`convert/bases.py`, which describes the rest of each base), and so does a CoMoE
adapter-only folder, which loads its base's weights when it is loaded.

A key is renamed by the first rule whose template its start matches (`{n}` a layer index), the rest of the key
(`weight`, `bias`) kept; a rule with several targets splits the tensor into equal chunks along dim 0 (a fused
`Wqkv` into query, key and value, as transformers' own conversion of `nomic_bert` does) and the way back
concatenates them; a rule with several sources concatenates their tensors along dim 0 into one (NomicBERT's
`fc12` and `fc11` into a gated `intermediate.dense`) and the way back splits it. The way back takes the first rule
that names a shared key, so a base whose checkpoints come in two namings lists the names of its transformers class
first. A key no rule matches keeps its name (BERT, RoBERTa and XLM-R need no rule). Task-head
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
    encoder it becomes (`ours`; several: the tensor's equal chunks along dim 0). `theirs` may be several prefixes
    instead, whose tensors are concatenated along dim 0 into the one of `ours`."""

    theirs: str | tuple[str, ...]
    ours: tuple[str, ...]

    def __post_init__(self):
        if len(self.sources) > 1 and len(self.ours) > 1:
            raise ValueError(f"a rule fuses several keys into one or splits one into several, not both: {self}")

    @property
    def sources(self) -> tuple[str, ...]:
        return (self.theirs,) if isinstance(self.theirs, str) else self.theirs


def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.escape(template).replace(r"\{n\}", r"(\d+)") + "(.+)$")


def _fill(template: str, match: re.Match) -> str:
    *layer, rest = match.groups()
    return template.format(n=layer[0] if layer else "") + rest


def _gather(parts: dict, name: str, index: int, count: int, tensor: torch.Tensor, into: dict) -> None:
    """Keep `tensor` as part `index` of `count` of `name`; once every part is there, their concatenation goes
    `into` the result."""
    parts.setdefault(name, [None] * count)[index] = tensor
    if all(part is not None for part in parts[name]):
        into[name] = torch.cat(parts.pop(name)).contiguous()


@dataclass(frozen=True)
class KeyLayout:
    """A base's key renames and the prefixes of its task-head checkpoints."""

    renames: tuple[Rename, ...] = ()
    head_prefixes: tuple[str, ...] = ("bert.", "roberta.", "model.")

    def _match(self, key: str) -> tuple[Rename, re.Match, int] | None:
        """`(rule, match, index of the source)` of the first rule one of whose sources `key` starts with."""
        for rule in self.renames:
            for index, source in enumerate(rule.sources):
                match = _pattern(source).match(key)
                if match:
                    return rule, match, index
        return None

    def our_keys(self, key: str) -> list[str]:
        """The shared encoder's key(s) of a key of the base's checkpoint (after any head prefix)."""
        found = self._match(key)
        if found is None:
            return [key]
        rule, match, _ = found
        return [_fill(ours, match) for ours in rule.ours]

    def their_keys(self, key: str) -> tuple[list[str], int, int] | None:
        """For a shared-encoder key some rule renames, `(base keys, chunk index, chunks)`: one base key of which
        it is chunk `index` of `chunks`, or the base keys its equal chunks become (index 0, chunks 1); else `None`."""
        for rule in self.renames:
            for index, ours in enumerate(rule.ours):
                match = _pattern(ours).match(key)
                if match:
                    return [_fill(source, match) for source in rule.sources], index, len(rule.ours)
        return None

    def to_ours(self, state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], list[str]]:
        """`(the shared encoder's state dict, the keys dropped)` of the base's checkpoint: head prefixes stripped,
        keys renamed, fused tensors split, parts concatenated, heads and saved buffers dropped.

        Raises:
            ValueError: where a part of a tensor that is concatenated is missing.
        """
        ours, dropped, parts = {}, [], {}
        for key, tensor in state.items():
            bare = next((key[len(prefix) :] for prefix in self.head_prefixes if key.startswith(prefix)), key)
            if bare.endswith(("position_ids", "token_type_ids")):
                continue  # buffers some old checkpoints saved
            names = self.our_keys(bare)
            if not names[0].startswith(ENCODER_ROOTS):
                dropped.append(key)
                continue
            found = self._match(bare)
            if found is not None and len(found[0].sources) > 1:
                _gather(parts, names[0], found[2], len(found[0].sources), tensor, ours)
                continue
            chunks = tensor.chunk(len(names), dim=0) if len(names) > 1 else (tensor,)
            ours.update({name: chunk.contiguous() for name, chunk in zip(names, chunks, strict=True)})
        if parts:
            raise ValueError(f"incomplete tensors {sorted(parts)}: a part of each is missing from the checkpoint")
        return ours, dropped

    def to_theirs(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The base's own state dict (its model class's names, no head prefix) of a shared-encoder state dict:
        renamed back, split tensors concatenated, concatenated ones split.

        Raises:
            ValueError: where a part of a split tensor is missing.
        """
        theirs, parts = {}, {}
        for key, tensor in state.items():
            target = self.their_keys(key)
            if target is None:
                theirs[key] = tensor
                continue
            names, index, count = target
            if len(names) > 1:
                theirs.update(zip(names, (chunk.contiguous() for chunk in tensor.chunk(len(names))), strict=True))
            else:
                _gather(parts, names[0], index, count, tensor, theirs)
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
_NOMIC_LAYER = "encoder.layer.{n}."
NOMIC_BERT_KEYS = KeyLayout(
    renames=(
        # transformers' NomicBertModel as it sits in memory (first: exports back load into it)
        Rename("embeddings.LayerNorm.", ("embeddings.LayerNorm.",)),
        Rename("layers.{n}.self_attn.q_proj.", (_NOMIC_LAYER + "attention.self.query.",)),
        Rename("layers.{n}.self_attn.k_proj.", (_NOMIC_LAYER + "attention.self.key.",)),
        Rename("layers.{n}.self_attn.v_proj.", (_NOMIC_LAYER + "attention.self.value.",)),
        Rename("layers.{n}.self_attn.o_proj.", (_NOMIC_LAYER + "attention.output.dense.",)),
        Rename("layers.{n}.post_attention_layernorm.", (_NOMIC_LAYER + "attention.output.LayerNorm.",)),
        # act(gate_proj(x)) * up_proj(x): the shared encoder's gated block activates its first half
        Rename(("layers.{n}.mlp.gate_proj.", "layers.{n}.mlp.up_proj."), (_NOMIC_LAYER + "intermediate.dense.",)),
        Rename("layers.{n}.mlp.down_proj.", (_NOMIC_LAYER + "output.dense.",)),
        Rename("layers.{n}.post_mlp_layernorm.", (_NOMIC_LAYER + "output.LayerNorm.",)),
        # the Hub's checkpoints (contrastors' names), which transformers also writes on save
        Rename("emb_ln.", ("embeddings.LayerNorm.",)),
        Rename(
            "encoder.layers.{n}.attn.Wqkv.",
            tuple(_NOMIC_LAYER + f"attention.self.{part}." for part in ("query", "key", "value")),
        ),
        Rename("encoder.layers.{n}.attn.out_proj.", (_NOMIC_LAYER + "attention.output.dense.",)),
        Rename("encoder.layers.{n}.norm1.", (_NOMIC_LAYER + "attention.output.LayerNorm.",)),
        # y = fc11(x) * act(fc12(x)): fc12 is the activated half
        Rename(
            ("encoder.layers.{n}.mlp.fc12.", "encoder.layers.{n}.mlp.fc11."), (_NOMIC_LAYER + "intermediate.dense.",)
        ),
        Rename("encoder.layers.{n}.mlp.fc1.", (_NOMIC_LAYER + "intermediate.dense.",)),
        Rename("encoder.layers.{n}.mlp.fc2.", (_NOMIC_LAYER + "output.dense.",)),
        Rename("encoder.layers.{n}.norm2.", (_NOMIC_LAYER + "output.LayerNorm.",)),
        Rename("encoder.layers.{n}.mlp.router.layer.", (_NOMIC_LAYER + "mlp.router.",)),
    ),
    head_prefixes=("nomic_bert.", "bert.", "model."),
)
# dense model_type -> its key layout
KEY_LAYOUTS = {
    "bert": BERT_KEYS,
    "roberta": BERT_KEYS,
    "xlm-roberta": BERT_KEYS,
    "mpnet": MPNET_KEYS,
    "modernbert": MODERNBERT_KEYS,
    "nomic_bert": NOMIC_BERT_KEYS,
}


__all__ = [
    "ENCODER_ROOTS",
    "Rename",
    "KeyLayout",
    "KEY_LAYOUTS",
    "BERT_KEYS",
    "MPNET_KEYS",
    "MODERNBERT_KEYS",
    "NOMIC_BERT_KEYS",
]
