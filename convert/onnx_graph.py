"""The graph an ONNX export traces: this package's model (a MoTE routes each row on the ids a client sends, by the
rule of `modeling/task_router.py`), then the folder's own Sentence-Transformers modules (pooling, normalisation),
traced by `torch.onnx.export(dynamo=True)` and written in the shape onnxruntime runs fastest (`onnx_layout.py`);
and how a client feeds and runs the written graph.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import onnx
import torch
from torch import nn

from moe_embed.convert.onnx_layout import eager_attention, fastest_layout
from moe_embed.errors import UsageError
from moe_embed.files import read_json

logger = logging.getLogger(__name__)


class SentenceEmbeddingGraph(nn.Module):
    """The model, then the folder's own Sentence-Transformers modules (`Pooling`, `Normalize`, ...):
    `(input_ids, attention_mask, token_type_ids[, task_ids]) -> (sentence_embedding, last_hidden_state[,
    routed_task_ids])`. A MoTE graph routes each row as the model does (`task_ids` >= 0, else the prefix the ids
    start with, else the default task); a one-task graph (`task`) sends every row to that task's expert."""

    def __init__(self, model: nn.Module, head: list[nn.Module], task: str | None = None):
        super().__init__()
        self.model, self.head, self.task = model, nn.ModuleList(head), task
        self.routed = model.config.model_type == "mote_bert"
        self.eval()  # an inference graph: no dropout, no aux losses

    def forward(self, input_ids, attention_mask, token_type_ids=None, task_ids=None):
        kwargs = {}
        if self.routed:
            kwargs = {"task": self.task} if self.task else {"task_ids": task_ids}
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs)
        features = {"token_embeddings": out.last_hidden_state, "attention_mask": attention_mask}
        for module in self.head:
            features = module(features)
        outputs = (features["sentence_embedding"], out.last_hidden_state)
        return outputs + (out.task_ids,) if self.routed else outputs


def output_names(graph: SentenceEmbeddingGraph) -> list[str]:
    # `last_hidden_state`: the name optimum, sentence-transformers' ONNX backend and transformers.js read
    return ["sentence_embedding", "last_hidden_state", *(["routed_task_ids"] if graph.routed else [])]


def st_head(folder: Path, model) -> list[nn.Module]:
    """The Sentence-Transformers modules after the input module, as `SentenceTransformer` loaded them."""
    head = list(model)[1:]
    if any(getattr(module, "include_prompt", True) is False for module in head):
        raise UsageError(f"{folder} pools without the prompt tokens, which needs the prompt length: not exported")
    return head


def load_model(folder: Path, task: str | None = None) -> nn.Module:
    """The folder's weights in this package's model class, or transformers' for a dense folder (fp32, eval);
    `task` loads only that task's experts."""
    from transformers import AutoModel

    from moe_embed.modeling.modeling_comoe import CoMoeBertModel
    from moe_embed.modeling.modeling_moe import MoeBertModel
    from moe_embed.modeling.modeling_mote import MoteBertModel

    classes = {"mote_bert": MoteBertModel, "moe_bert": MoeBertModel, "comoe_bert": CoMoeBertModel}
    kwargs = {"active_tasks": [task]} if task else {}
    model_type = read_json(folder / "config.json")["model_type"]
    model_class = classes.get(model_type, AutoModel)  # a dense folder: transformers' own class
    model = model_class.from_pretrained(str(folder), dtype=torch.float32, **kwargs)
    return model.eval()


def graph_inputs(tokenizer, texts: list[str], task_ids: list[int] | None = None) -> dict[str, torch.Tensor]:
    """A client's feed: the tokenizer's `input_ids`, `attention_mask` and (where it has them)
    `token_type_ids`, plus `task_ids` when given."""
    batch = tokenizer.encode_batch(texts)
    inputs = {
        "input_ids": torch.tensor([e.ids for e in batch]),
        "attention_mask": torch.tensor([e.attention_mask for e in batch]),
        "token_type_ids": torch.tensor([e.type_ids for e in batch]),
    }
    return inputs if task_ids is None else {**inputs, "task_ids": torch.tensor(task_ids)}


def export_graph(graph: SentenceEmbeddingGraph, inputs: dict, path: Path, opset: int | None) -> None:
    """Trace `graph` on `inputs` (a feed by name) with batch and sequence length dynamic and write `path`, in the
    shape that runs fastest (`convert/onnx_layout.py`: eager attention, LayerNorms on flattened rows, one weight
    per expert)."""
    config = graph.model.config
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    offset = getattr(config, "position_offset", 0)  # a plain BERT (the dense reference of the benchmarks) has none
    seq = torch.export.Dim("sequence", min=1, max=config.max_position_embeddings - offset)
    shapes = {name: {0: batch} if name == "task_ids" else {0: batch, 1: seq} for name in inputs}
    for name in ("onnxscript", "onnx_ir"):  # their optimiser passes log every rewrite at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    # a note, on every routed MoTE export, that an empty list attribute was given the type INTS (as it should be)
    logging.getLogger("onnx_ir._convenience").setLevel(logging.ERROR)
    # the exporter announces on every run that it skips torchvision's ops (this graph has none)
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    large = sum(p.numel() * p.element_size() for p in graph.parameters()) > 1.5 * 2**30  # protobuf's 2 GiB
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings(), eager_attention(graph.model):
        # notes on the exporter's own internals, on every run: a deprecated pytree check, and that the batch and
        # sequence axes keep the names given here
        warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
        warnings.filterwarnings("ignore", message=r"# The axis name: .* will not be used", category=UserWarning)
        program = torch.onnx.export(
            graph,
            (),
            kwargs=dict(inputs),
            input_names=list(inputs),
            output_names=output_names(graph),
            dynamic_shapes=shapes,
            dynamo=True,
            opset_version=opset,
            verbose=False,
        )
    model = program.model_proto
    fastest_layout(model)  # onnxruntime's fastest kernels, int8 for every weight (`convert/onnx_layout.py`)
    onnx.save_model(model, str(path), save_as_external_data=large, location=f"{path.name}.data")


def session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_graph(path_or_session, inputs: dict) -> list:
    """The graph's outputs for a feed by name (numpy arrays)."""
    runner = session(path_or_session) if isinstance(path_or_session, Path) else path_or_session
    names = {i.name for i in runner.get_inputs()}
    return runner.run(None, {name: value.numpy() for name, value in inputs.items() if name in names})


def embed(runner, tokenizer, texts: list[str], batch_size: int = 32):
    """`sentence_embedding` of `texts` fed as a client feeds them (tokenised by `tokenizer`), in batches of
    similar length, longest first, as `SentenceTransformer.encode` batches them: a long text pads only its own
    batch (a batch of short texts with one long one costs what a batch of long ones does)."""
    import numpy as np

    lengths = [sum(encoding.attention_mask) for encoding in tokenizer.encode_batch(texts)]
    order = sorted(range(len(texts)), key=lambda i: -lengths[i])
    ordered = [texts[i] for i in order]
    batches = range(0, len(texts), batch_size)
    vectors = np.concatenate(
        [run_graph(runner, graph_inputs(tokenizer, ordered[i : i + batch_size]))[0] for i in batches]
    )
    result = np.empty_like(vectors)
    result[order] = vectors
    return result


def build_graph(folder: Path, st, task: str | None = None) -> SentenceEmbeddingGraph:
    """The graph to trace for the folder (`st`: it loaded as `SentenceTransformer`); `task`: one MoTE task."""
    head = st_head(folder, st)
    try:
        model = load_model(folder, task)
        task = model.config.tasks[model.config.task_index(task)] if task else None
    except ValueError as error:  # unknown task: the message lists the valid ones
        raise UsageError(str(error)) from None
    return SentenceEmbeddingGraph(model, head, task)
