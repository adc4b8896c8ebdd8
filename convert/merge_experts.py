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

from moe_embed.convert.options import MergeOptions
from moe_embed.errors import UsageError, run_cli
from moe_embed.modeling.defaults import find_task
from moe_embed.options import parse_options


def merge(options: MergeOptions) -> Path:
    """Write the dense folder `options` describe; returns its path (validate, merge, write)."""
    from moe_embed.folders import EXPERT_MODELS, check_output, open_model_folder

    folder = open_model_folder(options.model_dir, EXPERT_MODELS)
    output = check_output(options.output, (folder.path,), options.overwrite)
    if folder.is_adapter and folder.model_type != "comoe_bert":
        raise UsageError(f"{folder.name} is an adapter-only folder of model_type={folder.model_type!r}")
    if folder.model_type == "mote_bert" and options.selected:
        check_task_names(folder.config, options.selected)
    from moe_embed.convert.merging import write_merged  # the model code: once the inputs are known good

    return write_merged(folder, output, options)


def check_task_names(config: dict, names: list[str]) -> None:
    """A `UsageError` for a name in `names` that is not a task (or an alias of one) of a MoTE folder's
    `config.json`, by the lookup the model's config makes: read from the file, before the model is loaded."""
    tasks, prefixes = list(config.get("tasks") or []), dict(config.get("task_prefixes") or {})
    aliases = dict(config.get("task_aliases") or {})
    for name in names:
        try:
            find_task(name, tasks, aliases, prefixes)
        except ValueError as error:
            raise UsageError(str(error)) from None


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    return merge(parse_options(MergeOptions, argv, __doc__, prog))


if __name__ == "__main__":
    run_cli(main)
