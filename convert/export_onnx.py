"""Export a MoTE, token-routed MoE or CoMoE folder to ONNX, with its pooling and normalisation in the graph.

    python convert/export_onnx.py models/mote-minilm --output models/mote-minilm-onnx                # routed
    python convert/export_onnx.py models/mote-minilm --task query --output models/minilm-query-onnx  # one task
    python convert/export_onnx.py models/moe-minilm --output models/moe-minilm-onnx

The graph takes `input_ids` and `attention_mask` (int64, `(batch, seq)`, any batch size and length) and,
for a routed MoTE graph, `task_ids` (int64, `(batch,)`: the expert of each row, or -1 to read the row's
instruction prefix, then the folder's default task). It returns `token_embeddings` (the last hidden
state), `sentence_embedding` (the folder's Sentence-Transformers pooling and normalisation applied),
and for a routed MoTE graph `routed_task_ids`, the expert each row went to. MoTE routes inside the graph, by tensor
ops: a batch may mix tasks, padding and lengths unlike the example it was traced on. A MoTE row that names
no task in a folder without a default task cannot raise in a graph: its outputs are NaN and its routed
task id -1. `--task` exports one task's experts as a plain graph at the dense model's cost.

The model is traced with this package's model code (whatever code the folder carries), by
`torch.onnx.export(..., dynamo=True)`. The output folder holds `model.onnx`, the tokenizer,
`onnx_config.json` (inputs, outputs, head modules, prompts, tasks) and a README; every export is checked
against PyTorch on batches unlike the example (other task mixes, padding, lengths, batch size 1) and
refused when any output differs by more than `--tolerance`.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as `python convert/export_onnx.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch
from torch import nn

from convert.checkpoint import (
    atomic_output_dir,
    copy_tokenizer_files,
    load_tokenizer,
    read_json,
    write_json,
)
from convert.folders import EXPERT_MODELS, check_output, open_model_folder
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("export_onnx")

CHECK_TEXTS = [
    "Isaac Newton formulated the laws of motion and universal gravitation.",
    "stocks fell",
    "A man is playing a guitar on a stage in front of a large and cheering crowd tonight.",
    "how do plants make energy?",
    "hi",
    "The quick brown fox jumps over the lazy dog.",
]


class SentenceEmbeddingGraph(nn.Module):
    """The model, then the folder's own Sentence-Transformers modules after it (`Pooling`, `Normalize`, ...):
    `(input_ids, attention_mask[, task_ids]) -> (token_embeddings, sentence_embedding[, routed_task_ids])`."""

    def __init__(self, model: nn.Module, head: list[nn.Module], task: str | None = None):
        super().__init__()
        self.model, self.head, self.task = model, nn.ModuleList(head), task
        self.routed = model.config.model_type == "mote_bert" and task is None
        self.eval()  # an inference graph: no dropout, no aux losses

    def forward(self, input_ids, attention_mask, task_ids=None):
        kwargs = {"task": self.task} if self.task else {"task_ids": task_ids} if self.routed else {}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        features = {"token_embeddings": out.last_hidden_state, "attention_mask": attention_mask}
        for module in self.head:
            features = module(features)
        tokens, sentence = out.last_hidden_state, features["sentence_embedding"]
        return (tokens, sentence, out.task_ids) if self.routed else (tokens, sentence)


def st_head(folder: Path, hidden_size: int) -> list[nn.Module]:
    """The Sentence-Transformers modules after the input module, loaded from the folder as
    `SentenceTransformer` loads them (mean pooling when the folder has no `modules.json`)."""
    from sentence_transformers.models import Pooling
    from sentence_transformers.util import import_from_string

    if not (folder / "modules.json").is_file():
        logger.warning("%s has no modules.json: mean pooling, no normalisation", folder)
        return [Pooling(hidden_size)]
    head = [import_from_string(e["type"]).load(str(folder / e["path"])) for e in read_json(folder / "modules.json")[1:]]
    if any(getattr(module, "include_prompt", True) is False for module in head):
        raise UsageError(f"{folder} pools without the prompt tokens, which needs the prompt length: not exported")
    return head


def load_model(folder: Path, task: str | None = None) -> nn.Module:
    """The folder's weights in this package's model class (fp32, eval); `task` loads only that task's experts."""
    from modeling.modeling_comoe import CoMoeBertModel
    from modeling.modeling_moe import MoeBertModel
    from modeling.modeling_mote import MoteBertModel

    classes = {"mote_bert": MoteBertModel, "moe_bert": MoeBertModel, "comoe_bert": CoMoeBertModel}
    kwargs = {"active_tasks": [task]} if task else {}
    model_type = read_json(folder / "config.json")["model_type"]
    model = classes[model_type].from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    return model.eval()


def example_inputs(graph: SentenceEmbeddingGraph, tokenizer, texts: list[str], task_ids: list[int] | None) -> tuple:
    batch = tokenizer(texts, padding=True, truncation=True, return_tensors="pt")
    inputs = (batch["input_ids"], batch["attention_mask"])
    return inputs + (torch.tensor(task_ids),) if graph.routed else inputs


def export_graph(graph: SentenceEmbeddingGraph, inputs: tuple, path: Path, opset: int | None) -> None:
    """Trace `graph` on `inputs` with batch and sequence length left dynamic and write `path`."""
    config = graph.model.config
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    seq = torch.export.Dim("sequence", min=1, max=config.max_position_embeddings - config.position_offset)
    shapes = {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    names = ["input_ids", "attention_mask"]
    outputs = ["token_embeddings", "sentence_embedding"]
    if graph.routed:
        shapes["task_ids"], names, outputs = {0: batch}, [*names, "task_ids"], [*outputs, "routed_task_ids"]
    for name in ("onnxscript", "onnx_ir"):  # their optimiser passes log every rewrite at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    large = sum(p.numel() * p.element_size() for p in graph.parameters()) > 1.5 * 2**30  # protobuf's 2 GiB
    with torch.no_grad():
        program = torch.onnx.export(
            graph,
            inputs,
            input_names=names,
            output_names=outputs,
            dynamic_shapes=shapes,
            dynamo=True,
            opset_version=opset,
            verbose=False,
        )
    program.save(str(path), external_data=large)


def check_graph(path: Path, graph: SentenceEmbeddingGraph, batches: list[tuple]) -> float:
    """Largest |ONNX Runtime - PyTorch| over `batches`, on real tokens and sentence embeddings (NaN rows
    must be NaN in both)."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    worst = 0.0
    for inputs in batches:
        got = session.run(None, {name: tensor.numpy() for name, tensor in zip(names, inputs, strict=True)})
        with torch.no_grad():
            expected = [t.numpy() for t in graph(*inputs)]
        real = inputs[1].bool().numpy()
        pairs = [(got[0][real], expected[0][real]), (got[1], expected[1])]
        if graph.routed:
            pairs.append((got[2].astype(np.float64), expected[2].astype(np.float64)))
        for a, b in pairs:
            if not np.array_equal(np.isnan(a), np.isnan(b)):
                return float("inf")
            diff = np.abs(np.nan_to_num(a) - np.nan_to_num(b))
            worst = max(worst, float(diff.max()) if diff.size else 0.0)
    return worst


def check_batches(graph: SentenceEmbeddingGraph, tokenizer) -> list[tuple]:
    """Batches unlike the example: every task mixed with prefixes, explicit ids and none; batch size 1."""
    config = graph.model.config
    if not graph.routed:
        return [example_inputs(graph, tokenizer, CHECK_TEXTS, None), example_inputs(graph, tokenizer, ["a"], None)]
    prefixes = [config.task_prefixes[t] for t in config.tasks]
    texts = [prefixes[i % len(prefixes)] + t for i, t in enumerate(reversed(CHECK_TEXTS))]
    ids = [-1] * len(texts)
    ids[1], ids[2] = 0, config.num_tasks - 1  # explicit ids beat the prefix
    texts.append(CHECK_TEXTS[0])  # no prefix: the default task (NaN in a strict folder)
    ids.append(-1)
    single = [prefixes[-1] + "a"]
    return [example_inputs(graph, tokenizer, texts, ids), example_inputs(graph, tokenizer, single, [-1])]


def export(args) -> Path:
    """Write the ONNX folder `args` describes; returns its path."""
    if (Path(args.model_dir) / "aea_config.json").is_file():
        raise UsageError(
            f"{args.model_dir} is an AEA folder: its per-token expert budgets are set by hooks at run time, which "
            "a static graph cannot hold; export the MoE model it was calibrated from"
        )
    opened = open_model_folder(args.model_dir, EXPERT_MODELS)
    folder, config, model_type = opened.path, opened.config, opened.model_type
    if args.task and model_type != "mote_bert":
        raise UsageError("--task applies to MoTE folders; a token-routed model has no task experts")
    if args.opset is not None and not 18 <= args.opset <= 23:
        raise UsageError(f"--opset must lie in 18..23 (the dynamo exporter's range), got {args.opset}")
    output = check_output(args.output, (folder,), args.overwrite)
    head = st_head(folder, config["hidden_size"])
    tokenizer = load_tokenizer(folder, trust_remote_code=True)
    try:
        model = load_model(folder, args.task)
        task = model.config.tasks[model.config.task_index(args.task)] if args.task else None
    except ValueError as error:  # unknown task: the message lists the valid ones
        raise UsageError(str(error)) from None
    graph = SentenceEmbeddingGraph(model, head, task)
    config = model.config
    if graph.routed:  # two tasks: one read from the prefix, one named by id
        texts, ids = [config.task_prefixes[config.tasks[0]] + "an example", "two"], [-1, config.num_tasks - 1]
    else:
        texts, ids = ["an example", "two"], None
    example = example_inputs(graph, tokenizer, texts, ids)
    with atomic_output_dir(output, args.overwrite) as tmp:
        start = time.perf_counter()
        logger.info("tracing and exporting %s (one pass, 20-60 s on 2 CPU cores)", folder)
        export_graph(graph, example, tmp / "model.onnx", args.opset)
        logger.info("exported in %.1f s", time.perf_counter() - start)
        logger.info("checking the graph against PyTorch with onnxruntime")
        worst = check_graph(tmp / "model.onnx", graph, check_batches(graph, tokenizer))
        logger.info("max |onnxruntime - torch| on batches unlike the example: %.2e", worst)
        if not worst <= args.tolerance:
            raise UsageError(f"the graph differs from PyTorch by {worst:.2e} > --tolerance {args.tolerance:g}")
        copy_tokenizer_files(folder, tmp)
        write_json(tmp / "onnx_config.json", onnx_config(folder, graph, tokenizer, args.opset))
        (tmp / "README.md").write_text(usage(folder, graph, tokenizer))
    print(f"wrote {output} (max |onnxruntime - torch| {worst:.1e})")
    return output


def onnx_config(folder: Path, graph: SentenceEmbeddingGraph, tokenizer, opset: int | None) -> dict:
    """What a runtime needs besides the graph: inputs, outputs, pooling, prompts and tasks."""
    import onnxruntime

    config = graph.model.config
    st_path = folder / "config_sentence_transformers.json"
    st_config = read_json(st_path) if st_path.is_file() else {}
    result = {
        "source_model_type": config.model_type,
        "inputs": ["input_ids", "attention_mask", *(["task_ids"] if graph.routed else [])],
        "outputs": ["token_embeddings", "sentence_embedding", *(["routed_task_ids"] if graph.routed else [])],
        "sentence_transformers_modules": [type(module).__name__ for module in graph.head],
        "max_length": config.max_position_embeddings - config.position_offset,
        "pad_token_id": tokenizer.pad_token_id,
        "prompts": st_config.get("prompts") or {},
        "default_prompt_name": st_config.get("default_prompt_name"),
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


def usage(folder: Path, graph: SentenceEmbeddingGraph, tokenizer) -> str:
    """The README of the ONNX folder: how to embed with onnxruntime and tokenizers alone."""
    feeds = '{"input_ids": input_ids, "attention_mask": attention_mask}'
    routing = ""
    if graph.routed:
        feeds = feeds[:-1] + ', "task_ids": np.full(len(texts), -1)}'
        routing = "Each row's expert comes from `task_ids` (-1: read the text's prefix, then the default task).\n"
    prefix = ""
    if graph.task or graph.routed:
        task = graph.task or graph.model.config.default_task or graph.model.config.tasks[0]
        prefix = graph.model.config.task_prefixes[task]
    return f"""# ONNX export of `{folder.name}`

Made by moe-embed's `convert/export_onnx.py`; `onnx_config.json` lists the inputs, outputs, the
Sentence-Transformers modules in the graph ({", ".join(type(m).__name__ for m in graph.head)}) and prompts. Put a task's
prefix in front of each text.
{routing}
```python
import numpy as np
import onnxruntime
from tokenizers import Tokenizer

tokenizer = Tokenizer.from_file("tokenizer.json")
tokenizer.enable_padding(pad_id={tokenizer.pad_token_id}, pad_token="{tokenizer.pad_token}")
tokenizer.enable_truncation({graph.model.config.max_position_embeddings - graph.model.config.position_offset})
session = onnxruntime.InferenceSession("model.onnx")
texts = ["{prefix}who was isaac newton?"]
encodings = tokenizer.encode_batch(texts)
input_ids = np.array([e.ids for e in encodings], dtype=np.int64)
attention_mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
embeddings = session.run(["sentence_embedding"], {feeds})[0]
```
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[1],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model_dir", help="MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder")
    parser.add_argument("--output", required=True, help="folder to write (model.onnx, tokenizer, onnx_config.json)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--task", default=None, help="MoTE: export only this task's experts, as a plain graph")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset, 18..23 (default: the exporter's)")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest |onnxruntime - torch| accepted (default: 1e-4)"
    )
    return parser


def main(argv: list[str] | None = None) -> Path:
    return export(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_cli(main)
