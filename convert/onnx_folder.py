"""The files around an exported graph, so that clients which know nothing of this package load the folder.

Text Embeddings Inference (ONNX backend), fastembed and onnxruntime with `tokenizers` read a fixed set of
files (sources in `docs/architecture.md`, "Serving contract"):

- `config.json`: the source folder's (TEI needs `architectures`, `model_type`, `hidden_size`,
  `num_hidden_layers`, `max_position_embeddings`);
- `tokenizer.json` with batch-longest right padding and right truncation at the input length (the folder's
  `max_seq_length`, plus the longest task prefix for MoTE, which the graph takes off or puts in before it
  cuts the row at `max_seq_length`), `tokenizer_config.json` with `model_max_length` at that length
  (fastembed's truncation) and `special_tokens_map.json` (fastembed <= 0.8 requires it; transformers 5 no
  longer writes it);
- `sentence_bert_config.json` with `max_seq_length` = the input length (TEI truncates there, prompt
  included), `modules.json` with the folder's pooling modules, `config_sentence_transformers.json` with the
  prompts (TEI's `prompt_name`, a client's prefix).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from moe_embed.convert.folder_writer import write_model_folder
from moe_embed.convert.onnx_checks import check_export, quantize_checked
from moe_embed.convert.onnx_graph import GRAPH_FILE, build_graph, export_graph, graph_inputs, output_names, session
from moe_embed.files import atomic_output_dir, read_json, write_json
from moe_embed.modeling.st_folder import (
    MODULE_CONFIG_FILE,
    write_portable_module_files,
)

if TYPE_CHECKING:
    from moe_embed.convert.options import ExportOptions

logger = logging.getLogger(__name__)


def write_folder_files(source: Path, target: Path, st, input_length: int):
    """Write the files above into `target`; returns the `tokenizers.Tokenizer` a client loads from them."""
    from tokenizers import Tokenizer

    tokenizer = st[0].tokenizer
    write_model_folder(
        target,
        config=serving_config(read_json(source / "config.json")),
        tokenizer=tokenizer,
        input_module="sentence_transformers.models.Transformer",
        modules_from=source,
        prompts=dict(st.prompts or {}),
        default_prompt_name=st.default_prompt_name,
    )
    client = Tokenizer.from_file(str(target / "tokenizer.json"))
    client.enable_padding(direction="right", pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)
    client.enable_truncation(input_length, direction="right")
    client.save(str(target / "tokenizer.json"))
    settings = read_json(target / "tokenizer_config.json")
    settings = {k: v for k, v in settings.items() if k not in ("is_local", "local_files_only")}  # load-time state
    # fastembed truncates at min(model_max_length, max_length)
    settings.update(
        model_max_length=input_length, max_length=input_length, padding_side="right", truncation_side="right"
    )
    write_json(target / "tokenizer_config.json", settings)
    write_json(target / "special_tokens_map.json", dict(tokenizer.special_tokens_map))
    # sentence-transformers' own `Transformer` reads the graph (`backend="onnx"`): its settings in the form every
    # version reads, as the module paths and pooling settings (`write_portable_module_files`)
    do_lower_case = read_json(target / MODULE_CONFIG_FILE).get("do_lower_case", False)
    write_json(target / MODULE_CONFIG_FILE, {"max_seq_length": input_length, "do_lower_case": do_lower_case})
    write_portable_module_files(target)
    return client


def serving_config(config: dict) -> dict:
    """The `config.json` of an exported folder: a plain BERT (RoBERTa where positions start after the padding
    index) with the source's encoder fields, which is what the graph's inputs and sizes are, so that
    transformers, optimum, sentence-transformers' ONNX backend and transformers.js load it with no remote code
    (the source's code is not in the folder); the source's own fields stay (tasks, prefixes, expert layers), as
    attributes the BERT config does not use. A folder of a transformers model type keeps its config."""
    if "auto_map" not in config:
        return config
    model_type = "roberta" if config.get("position_offset", 0) else "bert"
    kept = {key: value for key, value in config.items() if key not in ("auto_map", "architectures", "model_type")}
    architecture = {"bert": "BertModel", "roberta": "RobertaModel"}[model_type]
    return {
        "architectures": [architecture],
        "model_type": model_type,
        **kept,
        "source_model_type": config["model_type"],
    }


def onnx_config(graph, st, example: dict, input_length: int, opset: int | None, worst: float, agreement) -> dict:
    """What a runtime needs besides the graph: inputs, outputs, lengths, prompts, tasks, int8 agreement."""
    import onnxruntime

    config = graph.model.config
    result = {
        "source_model_type": config.model_type,
        "graph": GRAPH_FILE,
        "inputs": list(example),
        "outputs": output_names(graph),
        "sentence_transformers_modules": [type(module).__name__ for module in graph.head],
        "dimension": getattr(st, "get_embedding_dimension", st.get_sentence_embedding_dimension)(),
        "max_seq_length": st.max_seq_length,
        "input_length": input_length,
        "prompts": dict(st.prompts or {}),
        "default_prompt_name": st.default_prompt_name,
        "max_abs_difference": float(f"{worst:.3g}"),
        "int8": agreement,
        "opset": opset,
        "versions": {"torch": torch.__version__.split("+")[0], "onnxruntime": onnxruntime.__version__},
    }
    if config.model_type == "mote_bert":
        result.update(
            tasks=config.tasks,
            task_prefixes=config.task_prefixes,
            default_task=config.default_task,
            exported_task=graph.task,
        )
    return result


def write_onnx_folder(folder: Path, output: Path, options: ExportOptions) -> Path:
    """Trace, check (and quantise) the export of the opened `folder` and write the ONNX folder to `output`."""
    from moe_embed.folders import load_sentence_transformer

    st = load_sentence_transformer(folder, trust_remote_code=True, device="cpu")
    graph = build_graph(folder, st, options.task)
    model, input_length = graph.model, st.max_seq_length
    with atomic_output_dir(output, options.overwrite) as tmp:
        client = write_folder_files(folder, tmp, st, input_length)  # the tokenizer a client loads
        example_task_ids = [-1, model.config.num_tasks - 1] if options.task_ids_input else None
        first = next(iter((st.prompts or {}).values()), "")
        example = graph_inputs(client, [first + "an example", "two"], example_task_ids)
        if "token_type_ids" not in st[0].tokenizer.model_input_names:
            example.pop("token_type_ids")
        start = time.perf_counter()
        logger.info("tracing and exporting %s (one pass, 20-60 s on 2 CPU cores)", folder)
        export_graph(graph, example, tmp / GRAPH_FILE, options.opset)
        logger.info("exported in %.1f s", time.perf_counter() - start)
        fp32 = session(tmp / GRAPH_FILE)  # one session for every check
        worst = check_export(fp32, graph, st, client, example, options.tolerance)
        agreement = quantize_checked(tmp, fp32, st, client, options.int8_min_cosine) if options.quantize else None
        info = onnx_config(graph, st, example, input_length, options.opset, worst, agreement)
        write_json(tmp / "onnx_config.json", info)
        (tmp / "README.md").write_text(usage_card(folder.name, info))
    print(f"wrote {output} (max |onnxruntime - torch| {worst:.1e})")
    return output


def usage_card(name: str, info: dict) -> str:
    """The folder's README: the contract, the prompts, int8 agreement, and how each client loads it."""
    prompts = info["prompts"]
    example_prompt = prompts.get("query") or next(iter(prompts.values()), "")
    rows = "\n".join(f"| `{key}` | `{json.dumps(value)}` |" for key, value in prompts.items()) or "| (none) | |"
    routed = "routed_task_ids" in info["outputs"]
    if routed:
        default = info.get("default_task")
        routing = (
            "The graph routes each row by the prompt it starts with (a MoTE task prefix picks that task's "
            f"expert); a text without one is embedded as `SentenceTransformer.encode` embeds it without a "
            f"prompt{f' (the default task `{default}`)' if default else ''}. The graph cuts each row at "
            f"{info['max_seq_length']} tokens after the prompt is handled, as the PyTorch folder does."
        )
    elif info.get("exported_task"):
        routing = f"Every row goes to the `{info['exported_task']}` experts (send its prompt or none)."
    else:
        routing = "Put the prompt of your task in front of each text, as `SentenceTransformer.encode` would."
    int8 = info.get("int8")
    int8_text = (
        f"`{int8['file']}` (onnxruntime: dynamic int8, per-channel weights) agrees with the fp32 graph at cosine "
        f"min {int8['min_cosine']:.4f} / mean {int8['mean_cosine']:.4f} over {int8['texts']} texts (every prompt "
        "and none), measured by the exporter."
        if int8
        else "No int8 graph (export with `--quantize int8` for one)."
    )
    openvino = (int8 or {}).get("openvino")
    if openvino:
        int8_text += (
            f" `{openvino['file']}` (OpenVINO: static int8 by NNCF) agrees at cosine min "
            f"{openvino['min_cosine']:.4f} / mean {openvino['mean_cosine']:.4f} over the same texts."
        )
    openvino_snippet = (
        f"""
For int8 on OpenVINO, compile `{openvino["file"]}` instead (no precision hint needed).
"""
        if openvino
        else ""
    )
    inputs = ", ".join(f"`{i}`" for i in info["inputs"])
    outputs = ", ".join(f"`{o}`" for o in info["outputs"])
    return f"""# ONNX export of `{name}`

Made by moe-embed's `convert/export_onnx.py`. `onnx/model.onnx` takes {inputs} (int64) and returns
{outputs}: `sentence_embedding` is the folder's pooling and normalisation applied, the embedding
`SentenceTransformer.encode` gives (max |difference| {info["max_abs_difference"]:.1e}, checked at export).
{routing} Inputs are truncated at {info["input_length"]} tokens (`tokenizer.json`, `sentence_bert_config.json`).

{int8_text}

| prompt name | text to put in front |
|---|---|
{rows}

## onnxruntime and tokenizers

```python
import numpy as np
import onnxruntime
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("tokenizer.json")  # pads to the longest row, truncates at the input length
session = onnxruntime.InferenceSession("onnx/model.onnx")
texts = [{json.dumps(example_prompt + "who was isaac newton?")}]
encodings = tokenizer.encode_batch(texts)
feed = {{name: np.array([getattr(e, attr) for e in encodings], dtype=np.int64) for name, attr in
        [("input_ids", "ids"), ("attention_mask", "attention_mask"), ("token_type_ids", "type_ids")]}}
feed = {{i.name: feed[i.name] for i in session.get_inputs() if i.name in feed}}
embeddings = session.run(["sentence_embedding"], feed)[0]
```

## fastembed

```python
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType

TextEmbedding.add_custom_model(model="local/{name}", pooling=PoolingType.DISABLED, normalization=True,
                               sources=ModelSource(hf="local/{name}"), dim={info["dimension"]},
                               model_file="onnx/model.onnx")
model = TextEmbedding("local/{name}", specific_model_path=".")
embeddings = list(model.embed([{json.dumps(example_prompt + "who was isaac newton?")}]))
```

`sentence_embedding` is the graph's first output, which fastembed reads; `PoolingType.DISABLED` keeps it.

## Text Embeddings Inference

```
text-embeddings-router --model-id /path/to/{name} --pooling mean
```

TEI's CPU image tries the ONNX backend first, which loads `onnx/model.onnx` and returns `sentence_embedding`
as it is. Send `prompt_name` with a request (or start with `--default-prompt-name`) to pick a prompt above.

## OpenVINO

```python
import openvino
compiled = openvino.Core().compile_model("onnx/model.onnx", "CPU", {{"INFERENCE_PRECISION_HINT": "f32"}})
embeddings = compiled(feed)["sentence_embedding"]  # `feed` as for onnxruntime above
```

Without the f32 hint, OpenVINO runs in bf16 on CPUs that have it (cosine to fp32 about 0.99).
{openvino_snippet}"""


__all__ = ["write_folder_files", "write_onnx_folder", "onnx_config", "usage_card"]
