"""Write the adapter-only form of a CoMoE folder: its LoRA experts and routers (a few MB) with the
code, tokenizer and Sentence-Transformers files, naming the base model to load the rest from.

    python convert/extract_adapter.py models/comoe-tacl --output models/comoe-tacl-adapter
    python convert/extract_adapter.py models/comoe-tacl --output out --base sentence-transformers/all-MiniLM-L6-v2

The folder holds `adapter_config.json` (peft's file name and field names where they exist, with
`base_model_name_or_path`) and `adapter_model.safetensors`. `AutoModel.from_pretrained(OUT,
trust_remote_code=True)` and `SentenceTransformer(OUT, trust_remote_code=True)` load it by fetching
the base, which must have the adapter's shapes. The input folder is not modified.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as `python convert/extract_adapter.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convert.cards import PLACEHOLDER_OWNER, render_card, source_license
from convert.checkpoint import atomic_output_dir, read_json
from convert.folders import check_output, open_model_folder
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("extract_adapter")

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def write_adapter_folder(folder: Path, target: Path, base: str | None = None) -> None:
    """Write the adapter-only form of the full CoMoE folder `folder` into the folder `target` (created
    if missing): every file but the weights, then the adapters, `adapter_config.json` and a card."""
    from modeling.modeling_comoe import CoMoeBertModel

    folder, target = Path(folder), Path(target)
    config = read_json(folder / "config.json")
    base = base or config.get("base_model_name_or_path")
    if not base:
        raise UsageError(f"{folder}/config.json names no base_model_name_or_path; pass --base HUB_ID_OR_FOLDER")
    if Path(base).is_dir():
        base = str(Path(base).resolve())
    model = CoMoeBertModel.from_pretrained(str(folder))
    target.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        if path.name in WEIGHT_FILES or path.name.startswith(("model-", ".")) or path.name == "README.md":
            continue
        if path.is_dir():
            shutil.copytree(path, target / path.name, dirs_exist_ok=True)
        else:
            shutil.copy2(path, target / path.name)
    try:
        model.save_pretrained(target, adapter_only=True, base_model_name_or_path=base)
    except ValueError as error:  # e.g. the target already holds full weights
        raise UsageError(str(error)) from None
    render_card(
        target,
        f"{PLACEHOLDER_OWNER}/{target.name}",
        base_model=base,
        base_is_hub_id=not Path(base).is_dir(),
        license_id=source_license(folder),
    )


def extract_adapter(folder: Path, output: Path, base: str | None = None, overwrite: bool = False) -> Path:
    """Write the adapter-only folder of the CoMoE folder `folder` to `output`; returns `output`."""
    opened = open_model_folder(folder, {"comoe_bert": "CoMoE"})
    if opened.is_adapter:
        raise UsageError(f"{opened.name} is already an adapter-only folder")
    folder = opened.path
    output = check_output(output, (folder,), overwrite)
    with atomic_output_dir(output, overwrite) as tmp:
        write_adapter_folder(folder, tmp, base)
    size = (output / "adapter_model.safetensors").stat().st_size
    base = read_json(output / "adapter_config.json")["base_model_name_or_path"]
    print(f"wrote {output} (adapters only, {size / 1e6:.1f} MB; loads its base model {base})")
    return output


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model_dir", help="full CoMoE folder (comoe_bert), e.g. from upcycle.py or training")
    parser.add_argument("--output", required=True, help="folder to write")
    parser.add_argument(
        "--base",
        default=None,
        help="base model the adapter names: a Hub id or a local folder (default: the folder's base_model_name_or_path)",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    return parser


def main(argv: list[str] | None = None) -> Path:
    args = build_parser().parse_args(argv)
    return extract_adapter(Path(args.model_dir), Path(args.output), args.base, args.overwrite)


if __name__ == "__main__":
    run_cli(main)
