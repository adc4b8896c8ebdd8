"""Dense folders of published bases' shapes with random weights, for speed benchmarks where the real weights cannot be
had here (no Hub): speed depends on the shapes, not on the weights.

    python -m benchmarks.random_bases modernbert-base OUT   # answerdotai/ModernBERT-base's config, random weights

The folder is a Sentence-Transformers folder (CLS pooling, normalisation, as gte-modernbert-base) in transformers'
own class, with the tests' tiny byte-level BPE tokenizer (`tests/data/tiny-modernbert`): upcycling reads only the task
prefixes' ids from it, and the benchmarks feed random ids over the whole vocabulary.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# name -> (transformers model type, config fields, the tests' tiny folder whose tokenizer and modules it takes)
SHAPES = {
    "modernbert-base": (
        "modernbert",
        dict(
            vocab_size=50368,
            hidden_size=768,
            intermediate_size=1152,
            num_hidden_layers=22,
            num_attention_heads=12,
            max_position_embeddings=8192,
            local_attention=128,
            global_attn_every_n_layers=3,
            global_rope_theta=160000.0,
            local_rope_theta=10000.0,
        ),
        "tiny-modernbert",
    ),
}


def write_random_base(name: str, output: Path) -> Path:
    """Write the dense folder of shape `name` (`SHAPES`) to `output` (replaced if it exists); returns `output`."""
    import torch
    from transformers import AutoConfig, AutoModel

    model_type, fields, tiny = SHAPES[name]
    source = REPO / "tests" / "data" / tiny
    output = Path(output)
    if output.exists():
        shutil.rmtree(output)
    shutil.copytree(source, output, ignore=shutil.ignore_patterns("model.safetensors", "README.md"))
    special = {k: v for k, v in json.loads((source / "config.json").read_text()).items() if k.endswith("token_id")}
    torch.manual_seed(0)
    model = AutoModel.from_config(AutoConfig.for_model(model_type, **fields, **special))
    model.save_pretrained(str(output))
    pooling = json.loads((output / "1_Pooling" / "config.json").read_text())
    (output / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "word_embedding_dimension": 768}))
    (output / "README.md").write_text(f"# {name}, random weights\n\nWritten by `benchmarks/random_bases.py`.\n")
    return output


def main(argv: list[str] | None = None) -> None:
    from moe_embed.options import command_parser, parse

    parser = command_parser(__doc__)
    parser.add_argument("name", choices=sorted(SHAPES), help="the published shape")
    parser.add_argument("output", type=Path, help="folder to write (replaced if it exists)")
    args = parse(parser, argv)
    print(write_random_base(args.name, args.output))


if __name__ == "__main__":
    from moe_embed.errors import run_cli

    run_cli(main)
