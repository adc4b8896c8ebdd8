"""The instruction-conditioned (IC) baseline of a MoTE model: the dense checkpoint it was upcycled from, saved
with the expert folder's prompts, so that it sees exactly the inputs the expert model sees. The MoTE paper
compares MoTE with it; the experiments, the inter-task analysis and the training benchmark build it here.
"""

from __future__ import annotations

from pathlib import Path

from moe_embed.errors import UsageError
from moe_embed.files import read_json


def save_dense_with_prompts(expert_model: str | Path, output: str | Path, base: str | Path | None = None) -> Path:
    """Save the dense `base` (default: the bundled all-MiniLM-L6-v2) with the prompts of the upcycled expert
    folder `expert_model` to `output` (replaced if it exists), through the one folder writer; returns `output`."""
    from transformers import AutoModel

    from moe_embed.convert.folder_writer import write_model_folder
    from moe_embed.files import atomic_output_dir
    from moe_embed.folders import bundled_minilm_path, locate

    path = Path(expert_model) / "config_sentence_transformers.json"
    prompts = read_json(path).get("prompts")
    if not prompts:
        raise UsageError(f"expected an expert model folder with prompts in {path}")
    source = Path(bundled_minilm_path() if base is None else locate(str(base)))
    model = AutoModel.from_pretrained(str(source))
    with atomic_output_dir(output, overwrite=True) as tmp:
        write_model_folder(
            tmp,
            model=model,
            tokenizer_from=source,
            input_module="sentence_transformers.models.Transformer",
            modules_from=source,
            prompts=prompts,
        )
    return Path(output)


__all__ = ["save_dense_with_prompts"]
