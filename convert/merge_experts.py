"""Merge the experts of a MoTE, token-routed MoE or CoMoE folder into a plain dense transformers model.

    moe-embed merge models/mote-minilm --output models/minilm-ea              # Expert Averaging
    moe-embed merge models/mote-minilm --task query --output models/minilm-query
    moe-embed merge models/mote-minilm --experts clustering,document --output models/minilm-cd
    moe-embed merge models/moe-minilm --calibration texts.txt --output models/minilm-moe-ea
    moe-embed merge models/comoe-tacl --calibration texts.txt --output models/minilm-comoe-merged

(`python convert/merge_experts.py ...` is the same command.) Expert Averaging (MoTE paper, v1 section 3.3):
every expert layer's experts are averaged, the two LayerNorms included, into one feed-forward block, giving a
model with the dense architecture and memory. `--task` exports one task's experts unchanged: a MoTE model
used for one task is a dense model, and its folder keeps only that task's prompts. A CoMoE folder (full or
adapter-only) has its LoRA experts folded into the frozen linears, `W + Σ_i w_i · (alpha / r) · B_i A_i`,
with `w_i` each expert's mean routing weight on the calibration texts (uniform without them); routing depends
on the input, so this approximates the CoMoE model, and the mean cosine between both models' embeddings of
the calibration texts is printed. The output is a `bert` / `roberta` / `xlm-roberta` folder (like the
checkpoint the model was upcycled from) with the Sentence-Transformers files and prompts, loadable without
remote code.
"""

from __future__ import annotations

from pathlib import Path

from moe_embed.convert.options import DTYPES, MergeOptions
from moe_embed.usage import UsageError, command_parser, parse, run_cli, shard_size


def merge(options: MergeOptions) -> Path:
    """Write the dense folder `options` describe; returns its path (validate, merge, write)."""
    from moe_embed.convert.merging import write_merged
    from moe_embed.folders import EXPERT_MODELS, check_output, open_model_folder

    folder = open_model_folder(options.model_dir, EXPERT_MODELS)
    output = check_output(options.output, (folder.path,), options.overwrite)
    if folder.is_adapter and folder.model_type != "comoe_bert":
        raise UsageError(f"{folder.name} is an adapter-only folder of model_type={folder.model_type!r}")
    return write_merged(folder, output, options)


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog)
    parser.add_argument("model_dir", help="MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--task", help="MoTE: export this task's experts (only its prompts are kept)")
    parser.add_argument(
        "--experts",
        help="average only these experts: MoTE task names (e.g. clustering,document) or MoE indices (e.g. 0,3)",
    )
    parser.add_argument("--weights", help="comma-separated weights of the averaged experts (normalised)")
    parser.add_argument(
        "--calibration",
        help="MoE / CoMoE: text file, one text per line; weight each layer's experts by their router usage on it",
    )
    parser.add_argument("--dtype", choices=DTYPES, help="dtype of the saved weights (default: that of the input)")
    parser.add_argument(
        "--max-shard-size", default="2GB", type=shard_size, help="safetensors shard size above which weights are split"
    )
    parser.add_argument("--repo-id", help="Hub id shown in the model card's usage snippets")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    args = vars(parse(build_parser(prog), argv))
    args.pop("verbose")
    return merge(MergeOptions(**args))


if __name__ == "__main__":
    run_cli(main)
