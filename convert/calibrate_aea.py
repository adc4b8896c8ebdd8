"""Calibrate AEA (adaptive expert allocation) for a trained MoE model and write a folder that embeds with it.

    moe-embed calibrate-aea allenai/OLMoE-1B-7B-0924 --output models/olmoe-aea --alpha 6
    moe-embed calibrate-aea models/moe-tacl --output models/moe-tacl-aea --search
    moe-embed calibrate-aea models/moe-tacl --output models/moe-tacl-hs --allocation none --exit-layer 6

(`python convert/calibrate_aea.py ...` is the same command.) The expert homogeneity of every MoE layer (mean
pairwise cosine of all experts' outputs for the final real token) is measured once on the calibration texts
(default: the STS-B dev sentences of the data folder), turned into per-layer expert counts (`--alpha`,
`--shift`, `--exit-layer`; the budget of the layers after the exit layer goes to the kept ones), and stored
with the prompt template, pooling and per-token rule in `aea_config.json`.
`SentenceTransformer(OUTPUT, trust_remote_code=True).encode(texts)` then embeds with AEA applied. `--search`
picks `--alpha` and `--exit-layer` by Spearman correlation on the STS-B dev pairs. Supported: transformers'
OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral, GraniteMoE, DeepSeek-V2/V3 and this package's token-routed MoE encoder.
"""

from __future__ import annotations

from pathlib import Path

from moe_embed.convert.options import ALLOCATIONS, DEFAULT_ALPHAS, CalibrateOptions
from moe_embed.data import DATA_DIR_HELP
from moe_embed.modeling.defaults import AEA_EMBEDDINGS, AEA_ROUNDINGS
from moe_embed.usage import command_parser, parse, run_cli


def calibrate(options: CalibrateOptions) -> Path:
    """Check every input (the model folder, the output, the calibration texts and the data they default to),
    then measure, choose the allocation and write the folder; returns its path."""
    from moe_embed.convert.aea_calibration import run_calibration, sts_dev
    from moe_embed.folders import check_output, open_model_folder
    from moe_embed.readers import read_texts

    folder = open_model_folder(options.model)
    output = check_output(options.output, (folder.path,), options.overwrite)
    texts = read_texts(Path(options.calibration), "--calibration") if options.calibration else None
    dev = sts_dev(options.data_dir) if options.search or texts is None else None
    return run_calibration(options, folder, output, texts, dev)


def build_parser(prog: str | None = None):
    parser = command_parser(__doc__, prog)
    parser.add_argument("model", help="a supported MoE model: local folder or Hub id")
    parser.add_argument("--output", required=True, help="folder to write (refused if it exists, unless --overwrite)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --output folder")
    parser.add_argument("--calibration", help="text file, one text per line (default: the STS-B dev sentences)")
    parser.add_argument(
        "--allocation",
        choices=ALLOCATIONS,
        default="both",
        help="both: layer- and token-wise (AEA); layer / token: one of them; none: the unmodified model with "
        "the same prompt, pooling and exit layer (the baseline)",
    )
    parser.add_argument("--alpha", type=float, default=1.0, help="scaling α of (shift - s_l)^α (default 1)")
    parser.add_argument(
        "--shift", type=float, default=1.0, help="c in (c - s_l)^α: 1 is the paper's rule, 0.1 its Qwen variant"
    )
    parser.add_argument(
        "--exit-layer",
        type=int,
        help="number of layers whose output is embedded, 1..L (default L-1 for decoders, L for encoders)",
    )
    parser.add_argument(
        "--rounding",
        choices=AEA_ROUNDINGS,
        default="floor",
        help="per-token counts: the paper's floor, or largest remainder (spends each layer's budget exactly)",
    )
    parser.add_argument(
        "--embedding",
        choices=AEA_EMBEDDINGS,
        default="hidden",
        help="hidden: the pooled hidden state; moee-concat / moee-sum: MoEE with the routing weights",
    )
    parser.add_argument("--prompt", help="template with [TEXT] (default PromptEOL for decoders, the text for encoders)")
    parser.add_argument("--pooling", choices=("last", "mean"), help="default last for decoders, mean for encoders")
    parser.add_argument("--search", action="store_true", help="choose --alpha and --exit-layer on the STS-B dev pairs")
    parser.add_argument("--alphas", default=DEFAULT_ALPHAS, help=f"--search grid of α (default {DEFAULT_ALPHAS})")
    parser.add_argument("--exit-layers", help="--search grid of exit layers (default the last four)")
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    parser.add_argument("--batch-size", type=int, default=64, help="texts per forward pass")
    parser.add_argument("--max-length", type=int, default=256, help="truncate texts to this many tokens")
    return parser


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    args = vars(parse(build_parser(prog), argv))
    args.pop("verbose")
    return calibrate(CalibrateOptions(**args))


if __name__ == "__main__":
    run_cli(main)
