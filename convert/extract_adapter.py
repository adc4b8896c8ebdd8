"""Write the adapter-only form of a CoMoE folder: its LoRA experts and routers (a few MB) with the
code, tokenizer and Sentence-Transformers files, naming the base model to load the rest from.

    moe-embed extract-adapter models/comoe-tacl --output models/comoe-tacl-adapter
    moe-embed extract-adapter models/comoe-tacl --output out --base sentence-transformers/all-MiniLM-L6-v2

(`python convert/extract_adapter.py ...` is the same command.) The folder holds `adapter_config.json` (peft's
file name and field names where they exist, with `base_model_name_or_path`) and `adapter_model.safetensors`.
The base is named so that it survives a move: a Hub id as it is (the bundled all-MiniLM-L6-v2 by its Hub id),
a local folder by its path relative to the adapter folder. `AutoModel.from_pretrained(OUT,
trust_remote_code=True)` and `SentenceTransformer(OUT, trust_remote_code=True)` load it by fetching the base,
which must have the adapter's shapes (`base_model_name_or_path=FOLDER` in `from_pretrained`, or
`model_kwargs` in Sentence-Transformers, names another). The input folder is not modified.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.options import option, parse_options


def write_adapter_folder(folder: Path, target: Path, base: str | None = None) -> None:
    """Write the adapter-only form of the full CoMoE folder `folder` into the folder `target` (created if missing):
    the model's adapter-only save (`CoMoeBertModel.save_pretrained(adapter_only=True)`, which carries the
    folder's code, tokenizer and Sentence-Transformers files over), then the card."""
    from moe_embed.convert.cards import PLACEHOLDER_OWNER, render_card, source_license
    from moe_embed.files import read_json
    from moe_embed.folders import BUNDLED_MODEL_ID, is_bundled
    from moe_embed.modeling.modeling_comoe import CoMoeBertModel

    folder, target = Path(folder), Path(target)
    base = base or read_json(folder / "config.json").get("base_model_name_or_path")
    if not base:
        raise UsageError(f"{folder}/config.json names no base_model_name_or_path; pass --base HUB_ID_OR_FOLDER")
    if is_bundled(base):
        base = BUNDLED_MODEL_ID
    model = CoMoeBertModel.from_pretrained(str(folder))
    target.mkdir(parents=True, exist_ok=True)
    try:  # the model's own adapter save writes the folder: config, code, adapters, tokenizer, modules, prompts
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


def extract_adapter(folder: str | Path, output: str | Path, base: str | None = None, overwrite: bool = False) -> Path:
    """Write the adapter-only folder of the CoMoE folder `folder` to `output`; returns `output`."""
    from moe_embed.files import atomic_output_dir, read_json
    from moe_embed.folders import check_output, open_model_folder

    opened = open_model_folder(folder, {"comoe_bert": "CoMoE"})
    if opened.is_adapter:
        raise UsageError(f"{opened.name} is already an adapter-only folder")
    output = check_output(output, (opened.path,), overwrite)
    with atomic_output_dir(output, overwrite) as tmp:
        write_adapter_folder(opened.path, tmp, base)
    size = (output / "adapter_model.safetensors").stat().st_size
    named = read_json(output / "adapter_config.json")["base_model_name_or_path"]
    print(f"wrote {output} (adapters only, {size / 1e6:.1f} MB; loads its base model {named})")
    return output


@dataclass
class ExtractOptions:
    """`moe-embed extract-adapter`'s options (its `--help` is generated from the fields)."""

    model_dir: str = option(
        required=True, positional=True, help="full CoMoE folder (comoe_bert), e.g. from upcycle or training"
    )
    output: str = option(required=True, help="folder to write")
    base: str | None = option(
        help="base model the adapter names: a Hub id or a local folder (default: the folder's base_model_name_or_path)"
    )
    overwrite: bool = option(False, help="replace --output if it exists")


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    args = parse_options(ExtractOptions, argv, __doc__, prog)
    return extract_adapter(args.model_dir, args.output, args.base, args.overwrite)


if __name__ == "__main__":
    run_cli(main)
