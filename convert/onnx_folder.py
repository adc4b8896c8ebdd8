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

from moe_embed.convert.bases import architecture, dense_fields
from moe_embed.convert.cpu_graph import GRAPH_FILE
from moe_embed.convert.folder_writer import write_model_folder
from moe_embed.convert.onnx_checks import check_export, quantize_checked
from moe_embed.convert.onnx_graph import build_graph, export_graph, graph_inputs, output_names, session
from moe_embed.files import atomic_output_dir, read_json, write_json
from moe_embed.modeling.st_folder import MODULE_CONFIG_FILE

if TYPE_CHECKING:
    from moe_embed.convert.options import ExportOptions

logger = logging.getLogger(__name__)


def write_folder_files(source: Path, target: Path, st, input_length: int):
    """Write the files above into `target`, each once; returns the `tokenizers.Tokenizer` a client loads from them."""
    from tokenizers import Tokenizer

    source_settings = source / MODULE_CONFIG_FILE
    do_lower_case = (read_json(source_settings) if source_settings.is_file() else {}).get("do_lower_case", False)
    write_model_folder(
        target,
        config=serving_config(read_json(source / "config.json")),
        tokenizer=st[0].tokenizer,
        client_length=input_length,
        input_module="sentence_transformers.models.Transformer",
        modules_from=source,
        # sentence-transformers' own `Transformer` reads the graph (`backend="onnx"`): its settings in the form
        # every version reads, as the module paths and pooling settings are (`st_folder.write_modules`)
        module_settings={"max_seq_length": input_length, "do_lower_case": do_lower_case},
        carry_module_settings=False,
        prompts=dict(st.prompts or {}),
        default_prompt_name=st.default_prompt_name,
    )
    return Tokenizer.from_file(str(target / "tokenizer.json"))


def serving_config(config: dict) -> dict:
    """The `config.json` of an exported folder: the dense model of the source's base (`BertModel`, `MPNetModel`,
    `ModernBertModel`, ...: `convert/bases.py`) with the source's encoder fields, which is what the graph's inputs
    and sizes are, so that transformers, optimum, sentence-transformers' ONNX backend and transformers.js load it
    with no remote code (the source's code is not in the folder); the source's own fields stay (tasks, prefixes,
    expert layers), as attributes the base's config does not use. A folder of a transformers model type keeps its
    config."""
    if "auto_map" not in config:
        return config
    model_type, fields = dense_fields(config)
    kept = {key: value for key, value in config.items() if key not in ("auto_map", "architectures", "model_type")}
    return {
        "architectures": [architecture(model_type)],
        "model_type": model_type,
        **kept,
        **fields,
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
        agreement = (
            quantize_checked(tmp, fp32, st, client, options.int8_min_cosine, options.int8_variants)
            if options.quantize
            else None
        )
        info = onnx_config(graph, st, example, input_length, options.opset, worst, agreement)
        write_json(tmp / "onnx_config.json", info)
        usage_card(tmp, folder.name, info)
    print(f"wrote {output} (max |onnxruntime - torch| {worst:.1e})")
    return output


def usage_card(folder: Path, name: str, info: dict) -> None:
    """Write the folder's README (`hub_cards/onnx.md`): the contract, the prompts, int8 agreement, and how each
    client loads it."""
    from moe_embed.convert.cards import write_card
    from moe_embed.convert.cpu_graph import FAMILIES, family_file

    prompts = info["prompts"]
    families = [  # each family with the files of this folder that `cpu_graph` serves on such a CPU, per runtime
        (family, family_file(folder, "onnxruntime", family)[0], family_file(folder, "openvino", family)[0])
        for family in FAMILIES
    ]
    example_prompt = prompts.get("query") or next(iter(prompts.values()), "")
    write_card(
        folder,
        "onnx.md",
        name=name,
        info=info,
        routed="routed_task_ids" in info["outputs"],
        int8=info.get("int8"),
        openvino=(info.get("int8") or {}).get("openvino"),
        families=families,
        rows=[(key, json.dumps(value)) for key, value in prompts.items()],
        example_text=json.dumps(example_prompt + "who was isaac newton?"),
        inputs=", ".join(f"`{i}`" for i in info["inputs"]),
        outputs=", ".join(f"`{o}`" for o in info["outputs"]),
    )


__all__ = ["write_folder_files", "write_onnx_folder", "onnx_config", "usage_card"]
