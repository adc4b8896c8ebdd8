"""Make `tests/data/tiny-mpnet/`, `tests/data/tiny-modernbert/` and `tests/data/tiny-nomic-bert/`: tiny dense models of
the bases beyond BERT, in transformers' own classes (`MPNetModel`, `ModernBertModel`, `NomicBertModel`) with random
weights, laid out as the Sentence-Transformers
folders users embed with are, for the contract tests of every base.

- tiny-mpnet: an MPNet as all-mpnet-base-v2 is (mean pooling, normalisation; positions from the padding index + 1;
  the relative position bias the layers share), with tiny-minilm's uncased WordPiece vocabulary under MPNet's special
  tokens (`<s>`, `<pad>`, `</s>`, `<mask>`) and tiny-minilm's word and position embeddings, so that texts about one
  thing land near each other.
- tiny-modernbert: a ModernBERT as gte-modernbert-base is (CLS pooling, normalisation; rotary positions, local
  windows in two layers of three, pre-LN, GLU, no biases), with a byte-level BPE vocabulary trained here on
  tiny-minilm's words (ModernBERT's tokenizer is byte-level BPE), `[CLS]` and `[SEP]` around every text. Its window
  (`LOCAL_ATTENTION`) is short, so that a test text reaches beyond it. Its `config.json` has the Hub's form of
  ModernBERT's fields (`global_rope_theta`, `global_attn_every_n_layers`, ...), which transformers 5 reads into its
  newer ones.
- tiny-nomic-bert: a NomicBERT as nomic-embed-text-v1.5 is (mean pooling, normalisation; rotary positions, post-LN,
  SwiGLU, no biases), with tiny-minilm's vocabulary and word embeddings, saved by transformers (its `config.json` in
  transformers' names, its weights in the Hub's: `Wqkv`, `fc11`/`fc12`, `norm1`, `emb_ln`). The tests write the Hub's
  form of its config (`hub_nomic_config`) themselves.

Weights are drawn from a fixed seed and scaled up from transformers' initialisation (std `WEIGHT_STD`, norms away
from 1, a relative bias of std `BIAS_STD`), so that every part of each layer changes the outputs. Run it again to
rebuild both folders (the same bytes on the same machine and library versions):

    python tests/data/make_tiny_bases.py
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
HIDDEN, LAYERS, HEADS, INTERMEDIATE = 32, 4, 4, 48
MAX_SEQ_LENGTH = 128
WEIGHT_STD, BIAS_STD = 0.1, 0.5
LOCAL_ATTENTION = 8  # a token attends 4 positions either side in ModernBERT's local layers
BPE_VOCAB = 600
SEED = 0


def write_json(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def perturb(model, generator: torch.Generator) -> None:
    """Scale the random weights up (see the module docstring); the embeddings of `keep` stay as they are."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "relative_attention_bias" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * BIAS_STD)
            elif "norm" in name.lower() and name.endswith("weight"):
                param.copy_(1 + torch.randn(param.shape, generator=generator) * WEIGHT_STD)
            elif "embeddings" not in name:
                scale = WEIGHT_STD / (4 if name.endswith("bias") else 1)
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


def st_files(folder: Path, pooling: str, name: str, about: str) -> None:
    """The Sentence-Transformers files of a dense folder: Transformer, Pooling (`cls` or `mean`), Normalize."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    write_json(folder / "modules.json", modules)
    write_json(folder / "sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
    write_json(folder / "config_sentence_transformers.json", {"prompts": {}, "default_prompt_name": None})
    (folder / "1_Pooling").mkdir()
    write_json(
        folder / "1_Pooling" / "config.json",
        {
            "word_embedding_dimension": HIDDEN,
            "pooling_mode_cls_token": pooling == "cls",
            "pooling_mode_mean_tokens": pooling == "mean",
            "pooling_mode_max_tokens": False,
            "pooling_mode_mean_sqrt_len_tokens": False,
        },
    )
    (folder / "README.md").write_text(
        f"# {name}\n\n{about} Made by `tests/data/make_tiny_bases.py` for moe-embed's contract tests (its docstring "
        "says how). Not a useful model.\n",
        encoding="utf-8",
    )


def make_mpnet(tmp: Path, tiny: Path) -> None:
    from safetensors.torch import load_file
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizer

    words = (tiny / "vocab.txt").read_text(encoding="utf-8").splitlines()
    specials = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "[UNK]", "[MASK]": "<mask>"}
    order = ["[CLS]", "[PAD]", "[SEP]", "[UNK]"] + [w for w in words if w not in specials] + ["[MASK]"]
    vocab = [specials.get(word, word) for word in order]
    tokenizer = MPNetTokenizer(vocab={token: index for index, token in enumerate(vocab)}, do_lower_case=True)
    tokenizer.model_max_length = 512
    tokenizer.save_pretrained(str(tmp))
    config = MPNetConfig(
        vocab_size=len(vocab),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_SEQ_LENGTH + 2,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    torch.manual_seed(SEED)
    model = MPNetModel(config).eval()
    perturb(model, torch.Generator().manual_seed(SEED))
    minilm = load_file(str(tiny / "model.safetensors"))
    with torch.no_grad():  # tiny-minilm's embeddings of the same tokens, its positions after MPNet's two
        model.embeddings.word_embeddings.weight.copy_(
            minilm["embeddings.word_embeddings.weight"][[words.index(word) for word in order]]
        )
        model.embeddings.position_embeddings.weight[2:].copy_(
            minilm["embeddings.position_embeddings.weight"][:MAX_SEQ_LENGTH]
        )
    model.save_pretrained(str(tmp))
    st_files(tmp, "mean", "tiny-mpnet", "A tiny MPNet (random layers, tiny-minilm's vocabulary and embeddings).")


def train_bpe(tiny: Path):
    """A byte-level BPE vocabulary of `BPE_VOCAB` tokens learnt from tiny-minilm's words and the task prefixes, with
    ModernBERT's special tokens and its `[CLS] text [SEP]` template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    words = [w.removeprefix("##") for w in (tiny / "vocab.txt").read_text(encoding="utf-8").splitlines()]
    corpus = [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    corpus += ["search_query: search_document: classification: clustering: passage: query: document:"] * 20
    specials = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=BPE_VOCAB, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(corpus, trainer=trainer)
    cls, sep = bpe.token_to_id("[CLS]"), bpe.token_to_id("[SEP]")
    bpe.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    return bpe


def make_modernbert(tmp: Path, tiny: Path) -> None:
    from transformers import ModernBertConfig, ModernBertModel, PreTrainedTokenizerFast

    bpe = train_bpe(tiny)
    ids = {token: bpe.token_to_id(token) for token in ("[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]")}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
        unk_token="[UNK]",
        model_max_length=8192,
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.save_pretrained(str(tmp))
    settings = json.loads((tmp / "tokenizer_config.json").read_text())
    settings.update(tokenizer_class="PreTrainedTokenizerFast")  # as the Hub's ModernBERT folders name it
    settings.pop("backend", None)
    write_json(tmp / "tokenizer_config.json", settings)
    hub_fields = dict(  # the Hub's form of ModernBERT's config, which transformers 5 reads into its newer fields
        global_rope_theta=160000.0, local_rope_theta=10000.0, global_attn_every_n_layers=3
    )
    config = ModernBertConfig(
        vocab_size=bpe.get_vocab_size(),
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=8192,
        local_attention=LOCAL_ATTENTION,
        pad_token_id=ids["[PAD]"],
        cls_token_id=ids["[CLS]"],
        bos_token_id=ids["[CLS]"],
        sep_token_id=ids["[SEP]"],
        eos_token_id=ids["[SEP]"],
        **hub_fields,
    )
    torch.manual_seed(SEED)
    model = ModernBertModel(config).eval()
    perturb(model, torch.Generator().manual_seed(SEED + 1))
    with torch.no_grad():
        model.embeddings.tok_embeddings.weight.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(SEED + 2))
    model.save_pretrained(str(tmp))
    saved = json.loads((tmp / "config.json").read_text())
    for name in ("layer_types", "rope_parameters", "transformers_version"):
        saved.pop(name, None)
    write_json(tmp / "config.json", {**saved, **hub_fields})
    about = "A tiny ModernBERT (random weights, a byte-level BPE vocabulary of tiny-minilm's words)."
    st_files(tmp, "cls", "tiny-modernbert", about)


def make_nomic_bert(tmp: Path, tiny: Path) -> None:
    from safetensors.torch import load_file
    from transformers import BertTokenizerFast, NomicBertConfig, NomicBertModel

    tokenizer = BertTokenizerFast.from_pretrained(str(tiny))
    tokenizer.model_max_length = 8192
    tokenizer.save_pretrained(str(tmp))
    config = NomicBertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=8192,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},  # nomic-embed-text-v1.5's base
    )
    torch.manual_seed(SEED)
    model = NomicBertModel(config).eval()
    perturb(model, torch.Generator().manual_seed(SEED + 3))
    with torch.no_grad():
        model.embeddings.word_embeddings.weight.copy_(
            load_file(str(tiny / "model.safetensors"))["embeddings.word_embeddings.weight"]
        )
    model.save_pretrained(str(tmp))
    about = "A tiny NomicBERT (random layers, tiny-minilm's vocabulary and word embeddings)."
    st_files(tmp, "mean", "tiny-nomic-bert", about)


def write(name: str, make, tiny: Path) -> None:
    output = HERE / name
    with tempfile.TemporaryDirectory(dir=HERE) as scratch:
        tmp = Path(scratch) / name
        tmp.mkdir()
        make(tmp, tiny)
        for path in tmp.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
        if output.exists():
            shutil.rmtree(output)
        tmp.rename(output)
    print(f"wrote {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args()
    tiny = HERE / "tiny-minilm"
    write("tiny-mpnet", make_mpnet, tiny)
    write("tiny-modernbert", make_modernbert, tiny)
    write("tiny-nomic-bert", make_nomic_bert, tiny)


if __name__ == "__main__":
    main()
