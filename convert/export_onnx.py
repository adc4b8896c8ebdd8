"""Export a MoTE, token-routed MoE or CoMoE folder to a portable ONNX folder that serving engines load.

    python convert/export_onnx.py models/mote-minilm --output models/mote-minilm-onnx                # routed
    python convert/export_onnx.py models/mote-minilm --output models/mote-minilm-onnx --quantize int8
    python convert/export_onnx.py models/mote-minilm --task query --output models/minilm-query-onnx  # one task
    python convert/export_onnx.py models/moe-minilm --output models/moe-minilm-onnx

The folder follows the contract that Text Embeddings Inference's ONNX backend, fastembed, OpenVINO and
onnxruntime with a tokenizer read (`docs/architecture.md`, "Serving contract"): `onnx/model.onnx` takes
`input_ids`, `attention_mask` and `token_type_ids` (int64, `(batch, seq)`, any batch size and length) and
returns `sentence_embedding` first (the folder's pooling and normalisation applied), then
`token_embeddings`; `tokenizer.json`, `config.json`, `config_sentence_transformers.json` (prompts),
`sentence_bert_config.json` and the pooling modules sit at the root. A MoTE graph does in the graph what
`SentenceTransformer.encode` does to the text (`convert/graph_prompts.py`): the prompt a client puts in
front of the text picks the expert (a text without one goes to the default task, with the default prompt
put in front as `encode()` puts it), and the row is cut at the folder's `max_seq_length`. Its extra
outputs are `token_attention_mask` (the mask of `token_embeddings`, whose rows may have gained or lost the
prompt) and `routed_task_ids` (each row's expert; -1 and NaN embeddings where a folder without a default task
gets a row without a prompt). `--task-ids-input` adds a `task_ids` input (`(batch,)`, -1: the prompt decides)
for clients that route by id. `--task` exports one task's experts at the dense model's cost.

The model is traced with this package's model code by `torch.onnx.export(..., dynamo=True)`. Every export
is checked on batches unlike the example: against the PyTorch graph (all outputs) and, tokenised by the
written `tokenizer.json` alone as a client tokenises, against `SentenceTransformer.encode` with every
prompt and none; it is refused when either differs by more than `--tolerance`. `--quantize int8` adds
`onnx/model_qint8_avx512_vnni.onnx` (`convert/onnx_int8.py`) and refuses when a row's cosine to the fp32
embedding falls below `--int8-min-cosine`; the README states the measured agreement.
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

from convert.checkpoint import atomic_output_dir, read_json, write_json
from convert.folders import EXPERT_MODELS, check_output, load_sentence_transformer, open_model_folder
from convert.graph_prompts import PromptInputs, leading_specials
from convert.onnx_int8 import DEFAULT_MIN_COSINE
from moe_embed_cli import HelpFormatter, UsageError, run_cli

logger = logging.getLogger("export_onnx")

GRAPH_FILE = "onnx/model.onnx"
CHECK_TEXTS = [
    "Isaac Newton formulated the laws of motion and universal gravitation.",
    "stocks fell",
    "A man is playing a guitar on a stage in front of a large and cheering crowd tonight.",
    "how do plants make energy?",
    "hi",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 60),  # over every max_seq_length here
]


class SentenceEmbeddingGraph(nn.Module):
    """The model behind `PromptInputs` (MoTE), then the folder's own Sentence-Transformers modules (`Pooling`,
    `Normalize`, ...): `(input_ids, attention_mask, token_type_ids[, task_ids]) -> (sentence_embedding,
    token_embeddings[, token_attention_mask, routed_task_ids])`."""

    def __init__(self, model: nn.Module, head: list[nn.Module], task: str | None = None, prompts=None):
        super().__init__()
        self.model, self.head, self.task, self.prompts = model, nn.ModuleList(head), task, prompts
        self.routed = prompts is not None
        self.task_index = model.config.tasks.index(task) if task else -1
        self.eval()  # an inference graph: no dropout, no aux losses

    def forward(self, input_ids, attention_mask, token_type_ids=None, task_ids=None):
        kwargs = {}
        if self.routed:
            if self.task:  # a one-task graph: every row is that task's, whatever prompt it starts with
                task_ids = torch.full_like(input_ids[:, 0], self.task_index)
            input_ids, attention_mask, task_ids = self.prompts(input_ids, attention_mask, task_ids)
            kwargs = {"task": self.task} if self.task else {"task_ids": task_ids}
            if token_type_ids is not None:  # one segment: the first column's type, over the new length
                token_type_ids = token_type_ids[:, :1].expand_as(input_ids)
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids, **kwargs)
        features = {"token_embeddings": out.last_hidden_state, "attention_mask": attention_mask}
        for module in self.head:
            features = module(features)
        outputs = (features["sentence_embedding"], out.last_hidden_state)
        return outputs + (attention_mask, task_ids) if self.routed else outputs


def output_names(graph: SentenceEmbeddingGraph) -> list[str]:
    extra = ["token_attention_mask", "routed_task_ids"] if graph.routed else []
    return ["sentence_embedding", "token_embeddings", *extra]


def st_head(folder: Path, model) -> list[nn.Module]:
    """The Sentence-Transformers modules after the input module, as `SentenceTransformer` loaded them."""
    head = list(model)[1:]
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
    """Trace `graph` on `inputs` (a feed by name) with batch and sequence length dynamic and write `path`."""
    config = graph.model.config
    batch = torch.export.Dim("batch", min=1, max=1 << 20)
    offset = getattr(config, "position_offset", 0)  # a plain BERT (the dense reference of the benchmarks) has none
    seq = torch.export.Dim("sequence", min=1, max=config.max_position_embeddings - offset)
    shapes = {name: {0: batch} if name == "task_ids" else {0: batch, 1: seq} for name in inputs}
    for name in ("onnxscript", "onnx_ir"):  # their optimiser passes log every rewrite at INFO
        logging.getLogger(name).setLevel(logging.WARNING)
    large = sum(p.numel() * p.element_size() for p in graph.parameters()) > 1.5 * 2**30  # protobuf's 2 GiB
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
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
    program.save(str(path), external_data=large)


def session(path: Path):
    import onnxruntime

    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_graph(path_or_session, inputs: dict) -> list:
    """The graph's outputs for a feed by name (numpy arrays)."""
    runner = session(path_or_session) if isinstance(path_or_session, Path) else path_or_session
    names = {i.name for i in runner.get_inputs()}
    return runner.run(None, {name: value.numpy() for name, value in inputs.items() if name in names})


def embed(runner, tokenizer, texts: list[str], batch_size: int = 32):
    """`sentence_embedding` of `texts` fed as a client feeds them (tokenised by `tokenizer`), in batches."""
    import numpy as np

    batches = range(0, len(texts), batch_size)
    return np.concatenate([run_graph(runner, graph_inputs(tokenizer, texts[i : i + batch_size]))[0] for i in batches])


def max_difference(got, expected, rows=None) -> float:
    """Largest |got - expected| (NaN must be NaN in both: else inf); `rows` masks the compared entries."""
    import numpy as np

    got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if rows is not None:
        got, expected = got[rows], expected[rows]
    if not np.array_equal(np.isnan(got), np.isnan(expected)):
        return float("inf")
    diff = np.abs(np.nan_to_num(got) - np.nan_to_num(expected))
    return float(diff.max()) if diff.size else 0.0


def check_against_torch(runner, graph: SentenceEmbeddingGraph, batches: list[dict]) -> float:
    """Largest |ONNX Runtime - PyTorch graph| over `batches`, every output (token states where real)."""
    worst = 0.0
    for inputs in batches:
        got = run_graph(runner, inputs)
        with torch.no_grad():
            expected = [t.numpy() for t in graph(**inputs)]
        mask = (expected[2] if graph.routed else inputs["attention_mask"].numpy()).astype(bool)
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):  # token states: real positions only
            worst = max(worst, max_difference(a, b, mask if index == 1 else None))
    return worst


def check_against_encode(runner, model, tokenizer, task: str | None) -> float:
    """Largest |graph - `model.encode`| over texts sent as a client sends them (tokenised by `tokenizer`,
    the folder's `tokenizer.json`): without a prompt and with each prompt (a one-task graph: its own)."""
    worst = 0.0
    config = model[0].auto_model.config
    prompts = dict(model.prompts or {})
    cases = [(None, "")] if task or getattr(config, "default_task", True) is not None else []  # strict: no
    for name, prompt in prompts.items():  # a one-task graph is sent its own task's prompt or none
        if not task or config.tasks[config.task_index(name)] == task:
            cases.append((name, prompt))
    for name, prompt in cases:
        got = embed(runner, tokenizer, [prompt + text for text in CHECK_TEXTS])
        kwargs = {"prompt_name": name} if name else {}
        if task:
            kwargs["task"] = task
        worst = max(worst, max_difference(got, model.encode(CHECK_TEXTS, **kwargs)))
    return worst


def build_graph(folder: Path, st, task: str | None = None) -> SentenceEmbeddingGraph:
    """The graph to trace for the folder (`st`: it loaded as `SentenceTransformer`); `task`: one MoTE task."""
    head = st_head(folder, st)
    try:
        model = load_model(folder, task)
        task = model.config.tasks[model.config.task_index(task)] if task else None
    except ValueError as error:  # unknown task: the message lists the valid ones
        raise UsageError(str(error)) from None
    prompts = None
    if model.config.model_type == "mote_bert":
        tokenizer = st[0].tokenizer
        prompts = PromptInputs(
            model.config,
            leading_specials(model.config, tokenizer),
            st.max_seq_length,
            tokenizer.sep_token_id,
            tokenizer.pad_token_id,
            strip=not getattr(st[0], "prepend_task_prefix", True),
        )
    return SentenceEmbeddingGraph(model, head, task, prompts)


def export(args) -> Path:
    """Write the ONNX folder `args` describes; returns its path."""
    from convert.onnx_folder import usage_card, write_folder_files

    if (Path(args.model_dir) / "aea_config.json").is_file():
        raise UsageError(
            f"{args.model_dir} is an AEA folder: its per-token expert budgets are set by hooks at run time, which "
            "a static graph cannot hold; export the MoE model it was calibrated from"
        )
    opened = open_model_folder(args.model_dir, EXPERT_MODELS)
    folder, model_type = opened.path, opened.model_type
    if args.task and model_type != "mote_bert":
        raise UsageError("--task applies to MoTE folders; a token-routed model has no task experts")
    if args.task_ids_input and (model_type != "mote_bert" or args.task):
        raise UsageError("--task-ids-input applies to routed MoTE graphs (a MoTE folder without --task)")
    if args.opset is not None and not 18 <= args.opset <= 23:
        raise UsageError(f"--opset must lie in 18..23 (the dynamo exporter's range), got {args.opset}")
    if not 0 < args.int8_min_cosine <= 1:
        raise UsageError(f"--int8-min-cosine must lie in (0, 1], got {args.int8_min_cosine}")
    output = check_output(args.output, (folder,), args.overwrite)
    st = load_sentence_transformer(folder, trust_remote_code=True, device="cpu")
    graph = build_graph(folder, st, args.task)
    model, prompts = graph.model, graph.prompts
    input_length = st.max_seq_length + (prompts.longest if prompts is not None else 0)
    with atomic_output_dir(output, args.overwrite) as tmp:
        client = write_folder_files(folder, tmp, st, input_length)  # the tokenizer a client loads
        example_task_ids = [-1, model.config.num_tasks - 1] if args.task_ids_input else None
        first = next(iter((st.prompts or {}).values()), "")
        example = graph_inputs(client, [first + "an example", "two"], example_task_ids)
        if "token_type_ids" not in st[0].tokenizer.model_input_names:
            example.pop("token_type_ids")
        start = time.perf_counter()
        logger.info("tracing and exporting %s (one pass, 20-60 s on 2 CPU cores)", folder)
        export_graph(graph, example, tmp / GRAPH_FILE, args.opset)
        logger.info("exported in %.1f s", time.perf_counter() - start)
        fp32 = session(tmp / GRAPH_FILE)  # one session for every check
        worst = check_export(fp32, graph, st, client, example, args)
        agreement = quantize_checked(tmp, fp32, st, client, args) if args.quantize else None
        info = onnx_config(graph, st, example, input_length, args, worst, agreement)
        write_json(tmp / "onnx_config.json", info)
        (tmp / "README.md").write_text(usage_card(folder.name, info))
    print(f"wrote {output} (max |onnxruntime - torch| {worst:.1e})")
    return output


def check_export(runner, graph: SentenceEmbeddingGraph, st, client, example: dict, args) -> float:
    """Refuse the graph unless it matches the PyTorch graph and `encode` within `--tolerance`."""
    batches = [graph_inputs(client, CHECK_TEXTS), graph_inputs(client, ["a"])]
    if graph.routed and not graph.task:  # every task's prompt in one batch, in another order than the example
        config = graph.model.config
        texts = [
            config.task_prefixes[t] + text for t, text in zip(config.tasks * 2, reversed(CHECK_TEXTS), strict=False)
        ]
        batches.append(graph_inputs(client, texts))
    if "task_ids" in example:  # explicit ids beat the prompt
        batches = [{**b, "task_ids": torch.arange(len(b["input_ids"])) % 3 - 1} for b in batches]
    batches = [{name: value for name, value in b.items() if name in example} for b in batches]
    logger.info("checking the graph against PyTorch and SentenceTransformer.encode with onnxruntime")
    worst = check_against_torch(runner, graph, batches)
    encoded = check_against_encode(runner, st, client, graph.task)
    logger.info("max |onnxruntime - torch| %.2e; max |onnxruntime - encode| %.2e", worst, encoded)
    if not max(worst, encoded) <= args.tolerance:
        raise UsageError(
            f"the graph differs from PyTorch by {max(worst, encoded):.2e} > --tolerance {args.tolerance:g}"
        )
    return max(worst, encoded)


def quantize_checked(folder: Path, fp32_runner, st, client, args) -> dict:
    """Write the int8 graph beside the fp32 one (`fp32_runner`: its session); refuse when a row's cosine to
    fp32 is below the bound."""
    from convert.onnx_int8 import INT8_FILE, agreement_texts, quantize, row_cosines

    int8 = folder / "onnx" / INT8_FILE
    logger.info("quantising to int8 (%s)", int8.name)
    quantize(folder / GRAPH_FILE, int8)
    texts = agreement_texts(st.prompts or {})
    fp32, quantized = embed(fp32_runner, client, texts), embed(session(int8), client, texts)
    cos = row_cosines(quantized, fp32)
    agreement = {"file": f"onnx/{INT8_FILE}", "texts": len(texts), "min_cosine": round(float(cos.min()), 4)}
    agreement["mean_cosine"] = round(float(cos.mean()), 4)
    logger.info("int8 against fp32 over %d texts: cosine min %.4f, mean %.4f", len(texts), cos.min(), cos.mean())
    if not cos.min() >= args.int8_min_cosine:
        raise UsageError(
            f"the int8 graph's cosine to fp32 falls to {cos.min():.4f} < --int8-min-cosine {args.int8_min_cosine:g} "
            f"(mean {cos.mean():.4f}); export without --quantize or accept a lower bound"
        )
    return agreement


def onnx_config(graph, st, example: dict, input_length: int, args, worst: float, agreement) -> dict:
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
        "opset": args.opset,
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n", 2)[1],
        formatter_class=HelpFormatter,
    )
    parser.add_argument("model_dir", help="MoTE (mote_bert), token-routed MoE (moe_bert) or CoMoE (comoe_bert) folder")
    parser.add_argument("--output", required=True, help="folder to write (onnx/model.onnx, tokenizer, configs, README)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument("--task", default=None, help="MoTE: export only this task's experts, as a plain graph")
    parser.add_argument(
        "--task-ids-input", action="store_true", help="MoTE: add a task_ids input (-1: the prompt decides)"
    )
    parser.add_argument(
        "--quantize", choices=["int8"], default=None, help="also write onnx/model_qint8_avx512_vnni.onnx"
    )
    parser.add_argument(
        "--int8-min-cosine",
        type=float,
        default=DEFAULT_MIN_COSINE,
        help="refuse the int8 graph when a row's cosine to fp32 is below this (default: %(default)s)",
    )
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset, 18..23 (default: the exporter's)")
    parser.add_argument(
        "--tolerance", type=float, default=1e-4, help="largest |onnxruntime - torch| accepted (default: 1e-4)"
    )
    return parser


def main(argv: list[str] | None = None) -> Path:
    return export(build_parser().parse_args(argv))


if __name__ == "__main__":
    run_cli(main)
