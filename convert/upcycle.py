"""Upcycle a dense encoder checkpoint (BERT, RoBERTa, XLM-R, MPNet, ModernBERT) into an expert model folder.

    moe-embed upcycle                                 # bundled all-MiniLM-L6-v2 -> models/mote-minilm
    moe-embed upcycle --base sentence-transformers/all-mpnet-base-v2 --expert-layers all
    moe-embed upcycle --arch moe --num-local-experts 8 --num-experts-per-tok 2     # -> models/moe-minilm
    moe-embed upcycle --arch comoe --num-local-experts 4 --num-experts-per-tok 2 --lora-rank 16 --lora-alpha 32

(`python convert/upcycle.py ...` is the same command.) Every expert starts as a copy of the dense layer it
replaces (CoMoE: a LoRA expert with B = 0). A MoTE model, a CoMoE model, and a token-routed MoE with
renormalised top-k weights and no expert noise then compute the dense model's function; the converter
checks that before writing. The output folder loads with `AutoModel.from_pretrained(..., trust_remote_code=True)`
and `SentenceTransformer(..., trust_remote_code=True)`; it is written atomically, the input is never touched,
and an existing output is replaced only with `--overwrite`.
"""

from __future__ import annotations

from pathlib import Path

from moe_embed.convert.options import UpcycleOptions, parse_upcycle_options
from moe_embed.errors import run_cli


def upcycle(options: UpcycleOptions) -> Path:
    """Write the model folder `options` describe (`MoteOptions`, `MoeOptions`, `CoMoeOptions`, or
    `upcycle_options(arch, ...)`); returns its path.

    The base is opened first (a missing one is reported before anything about the output), then the
    output checked, then the model built, checked against the dense model and written atomically."""
    from moe_embed.folders import bundled_minilm_path, check_output, locate

    source = Path(bundled_minilm_path()) if options.base is None else locate(options.base)
    output = check_output(options.output_path, (source,), options.overwrite)
    from moe_embed.convert.builders import write_upcycled  # the model code: imported once the inputs are known good

    return write_upcycled(options, source, output)


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    return upcycle(parse_upcycle_options(argv, __doc__, prog))


if __name__ == "__main__":
    run_cli(main)
