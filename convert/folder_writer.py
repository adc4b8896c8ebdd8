"""The one writer of model folders: every converter that writes a folder (`upcycle`, `merge`, `export`,
`calibrate-aea`) calls `write_model_folder`, which writes each part a folder may hold in one order and one
form, and `moe_embed.folders.open_model_folder` is the one reader.

    weights and config.json   a transformers model's `save_pretrained` (or a config alone, for a graph folder)
    code                      one generated file per entry point, and `auto_map` (`remote_code.write_folder_code`)
    tokenizer                 the source folder's tokenizer files, or a tokenizer object's `save_pretrained`
    Sentence-Transformers     modules.json (the input module, then the source's modules or mean pooling),
                              sentence_bert_config.json, config_sentence_transformers.json with the prompts
    card                      README.md, by the caller's card function (each folder type has its template)

The prompts are derived from the tasks where the folder is made (`modeling.defaults.sentence_transformers_prompts`)
and written here once; `config.json` holds the tasks and prefixes the model routes by, as the model's config
saves them. The caller writes into a temporary folder (`moe_embed.files.atomic_output_dir`), so a failure leaves
no partial output.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moe_embed.convert.checkpoint import copy_tokenizer_files
from moe_embed.convert.remote_code import write_folder_code
from moe_embed.files import write_json
from moe_embed.modeling.st_folder import write_model_config, write_module_config, write_modules


def write_model_folder(
    target: Path,
    *,
    model=None,
    config: dict | None = None,
    max_shard_size: str | int = "2GB",
    code: str | None = None,
    tokenizer_from: Path | None = None,
    tokenizer=None,
    input_module: str,
    modules_from: Path | None = None,
    following_modules: list[dict] | None = None,
    module_settings: dict | None = None,
    prompts: dict | None = None,
    default_prompt_name: str | None = None,
    card: Callable[[Path], None] | None = None,
) -> None:
    """Write a model folder into the existing folder `target`.

    Args:
        model: a transformers model, saved with `save_pretrained` (weights and `config.json`); or
        config: the `config.json` of a folder whose weights are written otherwise (an ONNX graph).
        code: a kind of `manifest.FOLDER_FILES` (a model type, or `aea`): its generated code files.
        tokenizer_from: a folder whose tokenizer files are copied; or `tokenizer`, saved as it is.
        input_module: the Sentence-Transformers input module, `file.Class` at the folder root or
            sentence-transformers' own `Transformer`.
        modules_from: the folder whose modules after the input module (pooling, normalisation) and whose
            `sentence_bert_config.json` carry over (none: mean pooling), unless `following_modules` lists them.
        module_settings: entries for `sentence_bert_config.json`, over the carried-over ones.
        prompts, default_prompt_name: `config_sentence_transformers.json`'s.
        card: writes `README.md` into the folder it is given.
    """
    target = Path(target)
    if (model is None) == (config is None):
        raise ValueError("give the folder's model or its config, not both")
    if (tokenizer_from is None) == (tokenizer is None):
        raise ValueError("give the folder the tokenizer files come from or the tokenizer, not both")
    if model is not None:
        model.save_pretrained(target, max_shard_size=max_shard_size)
        hidden_size = model.config.hidden_size
    else:
        write_json(target / "config.json", config)
        hidden_size = config["hidden_size"]
    if code is not None:
        write_folder_code(target, code)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(target))
    else:
        copy_tokenizer_files(tokenizer_from, target)
    if following_modules is None:
        write_modules(modules_from or target, target, input_module, hidden_size)
    else:
        write_json(target / "modules.json", following_modules_json(target, input_module, following_modules))
    write_module_config(modules_from or target, target, module_settings)
    write_model_config(target, prompts or {}, default_prompt_name)
    if card is not None:
        card(target)


def following_modules_json(target: Path, input_module: str, following: list[dict]) -> list[dict]:
    """`modules.json` of the input module then `following` (`{"path": ..., "type": ...}`), each path created."""
    modules = [{"idx": 0, "name": "0", "path": "", "type": input_module}]
    for entry in following:
        (target / entry["path"]).mkdir(parents=True, exist_ok=True)
        modules.append({"idx": len(modules), "name": str(len(modules)), **entry})
    return modules


__all__ = ["write_model_folder"]
