"""The Sentence-Transformers files of a model folder: `modules.json` (this package's input module first,
then the source's pooling and normalisation modules), the module settings (`sentence_bert_config.json`)
and the model settings with the prompts (`config_sentence_transformers.json`). One copy, used by the
folder writer of the converters (`moe_embed.convert.folder_writer`) and by
`CoMoeBertModel.save_pretrained(..., adapter_only=True)`.

CoMoE folders carry it (inlined into their code): it imports only the standard library (and, to record their
versions, sentence-transformers, transformers and torch when the model settings are written).
"""

import json
import os
import shutil

MODULES_FILE = "modules.json"
MODULE_CONFIG_FILE = "sentence_bert_config.json"
MODEL_CONFIG_FILE = "config_sentence_transformers.json"

# sentence-transformers 6 saves its modules under new import paths and the pooling settings under new
# names; 6.x reads the 5.x forms too, 5.x reads only its own (see `write_portable_module_files`).
PORTABLE_MODULES = {
    "Pooling": "sentence_transformers.models.Pooling",
    "Normalize": "sentence_transformers.models.Normalize",
}
POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "mean_sqrt_len_tokens": "pooling_mode_mean_sqrt_len_tokens",
    "weightedmean": "pooling_mode_weightedmean_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def read_json(path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def write_json(path, data) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def portable_module_entry(entry: dict) -> dict:
    """A `modules.json` entry in the form every supported sentence-transformers reads (the 5.x import path of
    Pooling and Normalize; other modules, ours at the folder root, as they are)."""
    kind = entry["type"].rsplit(".", 1)[-1]
    if entry["type"].startswith("sentence_transformers.") and kind in PORTABLE_MODULES:
        return {**entry, "type": PORTABLE_MODULES[kind]}
    return entry


def portable_pooling(config: dict) -> dict:
    """Pooling settings in the 5.x form (6.x's `pooling_mode` and `embedding_dimension` as 5.x's flags)."""
    if "pooling_mode" not in config:
        return config
    config = dict(config)
    modes = config.pop("pooling_mode")
    modes = [modes] if isinstance(modes, str) else list(modes)
    legacy = {"word_embedding_dimension": config.pop("embedding_dimension")}
    legacy.update({POOLING_FLAGS[mode]: True for mode in modes})
    return {**legacy, **config}


def copy_module_folder(source: str, target: str, kind: str) -> None:
    """Copy a module's folder, each file once; a Pooling module's settings are written in the portable form."""
    pooling = kind == "Pooling" and os.path.isfile(os.path.join(source, "config.json"))
    skip = (lambda folder, names: ["config.json"] if folder == source else []) if pooling else None
    shutil.copytree(source, target, ignore=skip)
    if pooling:
        write_json(
            os.path.join(target, "config.json"), portable_pooling(read_json(os.path.join(source, "config.json")))
        )


def write_modules(source, target, input_module: str, hidden_size: int) -> None:
    """`modules.json` in `target` naming `input_module` ("file.Class" with its file at the folder root, or
    sentence-transformers' own `Transformer`) first, then the modules after the input module of `source` (their
    folders copied), or mean pooling when `source` is not a Sentence-Transformers folder; in the form every
    supported sentence-transformers version reads (`portable_module_entry`)."""
    source, target = str(source), str(target)
    modules = [{"idx": 0, "name": "0", "path": "", "type": input_module}]
    if os.path.isfile(os.path.join(source, MODULES_FILE)):
        for entry in read_json(os.path.join(source, MODULES_FILE))[1:]:
            # modules without settings (Normalize) may have no folder in the source: an empty one, so that the
            # folder names no path that is not there
            if entry.get("path") and os.path.isdir(os.path.join(source, entry["path"])):
                kind = entry["type"].rsplit(".", 1)[-1]
                copy_module_folder(os.path.join(source, entry["path"]), os.path.join(target, entry["path"]), kind)
            elif entry.get("path"):
                os.makedirs(os.path.join(target, entry["path"]), exist_ok=True)
            modules.append({**portable_module_entry(entry), "idx": len(modules), "name": str(len(modules))})
    else:
        os.makedirs(os.path.join(target, "1_Pooling"), exist_ok=True)
        pooling = {"word_embedding_dimension": hidden_size, "pooling_mode_mean_tokens": True}
        write_json(os.path.join(target, "1_Pooling", "config.json"), pooling)
        modules.append({"idx": 1, "name": "1", "path": "1_Pooling", "type": PORTABLE_MODULES["Pooling"]})
    write_json(os.path.join(target, MODULES_FILE), modules)


def write_module_config(source, target, settings: dict | None = None) -> None:
    """`sentence_bert_config.json` in `target`: the source's (if any; none when `source` is `None`), with
    `settings`."""
    path = os.path.join(str(source), MODULE_CONFIG_FILE)
    config = read_json(path) if source is not None and os.path.isfile(path) else {}
    config.update(settings or {})
    write_json(os.path.join(str(target), MODULE_CONFIG_FILE), config)


def write_model_config(target, prompts: dict, default_prompt_name: str | None = None) -> None:
    """`config_sentence_transformers.json` in `target`: the prompts, the default prompt, cosine similarity and
    the versions of the libraries that wrote the folder (sentence-transformers' where it is installed: the CoMoE
    model file carries this code, and transformers requires every import of a model file that no `try` guards)."""
    import torch
    import transformers

    versions = {"transformers": transformers.__version__, "pytorch": torch.__version__.split("+")[0]}
    try:
        import sentence_transformers

        versions = {"sentence_transformers": sentence_transformers.__version__, **versions}
    except ImportError:
        pass
    write_json(
        os.path.join(str(target), MODEL_CONFIG_FILE),
        {
            "model_type": "SentenceTransformer",
            "__version__": versions,
            "prompts": prompts,
            "default_prompt_name": default_prompt_name,
            "similarity_fn_name": "cosine",
        },
    )


def write_portable_module_files(folder) -> None:
    """Rewrite a folder saved by sentence-transformers 6 so that 5.x loads it as well: the Pooling and
    Normalize entries of `modules.json` under their 5.x paths and the Pooling settings in the 5.x form.
    Other modules (ours, at the folder root) are left as they are. (A training run's output, which
    sentence-transformers' own `save` wrote; the converters write these forms at once, `write_modules`.)"""
    folder = str(folder)
    modules = [portable_module_entry(entry) for entry in read_json(os.path.join(folder, MODULES_FILE))]
    for entry in modules:
        if entry["type"].rsplit(".", 1)[-1] == "Pooling":
            path = os.path.join(folder, entry["path"], "config.json")
            config = read_json(path)
            if "pooling_mode" in config:
                write_json(path, portable_pooling(config))
    write_json(os.path.join(folder, MODULES_FILE), modules)


__all__ = [
    "MODULES_FILE",
    "MODULE_CONFIG_FILE",
    "MODEL_CONFIG_FILE",
    "write_modules",
    "write_module_config",
    "write_model_config",
    "write_portable_module_files",
    "portable_module_entry",
    "portable_pooling",
]
