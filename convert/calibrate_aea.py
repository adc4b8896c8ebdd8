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

from moe_embed.convert.options import CalibrateOptions
from moe_embed.errors import run_cli
from moe_embed.options import parse_options


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


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    return calibrate(parse_options(CalibrateOptions, argv, __doc__, prog))


if __name__ == "__main__":
    run_cli(main)
