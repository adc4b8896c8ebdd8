"""The same dense model exported in different graph shapes, quantised alike, timed in one run: why the package
writes the graph it writes (`convert/onnx_layout.py`).

    python -m benchmarks.int8_graphs
    python -m benchmarks.int8_graphs --seq-lens 16,128 --repeats 5

The bundled all-MiniLM-L6-v2 (mean pooling, normalisation in the graph) is exported four ways and each graph
is quantised by the exporter's setting (`convert/onnx_int8.quantize`: per-channel QInt8 MatMul weights):

- `dynamo`: `torch.onnx.export(dynamo=True)` as it comes (sdpa attention), the package's graph before the
  rewrites;
- `dynamo, eager attention`: the same traced through the eager attention;
- `package`: what `moe-embed export` writes (eager attention, LayerNorms on flattened rows, one weight per
  expert: `convert/onnx_graph.export_graph`);
- `torchscript`: `torch.onnx.export(dynamo=False)` (deprecated by PyTorch), where this torch still has it;
- `package, keys copied`: the package's graph quantised alike but without `transposed_operands_in_matmul`, so
  each layer's keys are copied by a transpose that moves their innermost axis (the int8 file before run 11).

Each int8 graph runs in onnxruntime (default session options, as a client creates them) beside the
PyTorch module (fp32, sdpa) on random token ids, interleaved rounds; cells give seq/s and the ratio to
PyTorch, with the min cosine of int8 to the PyTorch embedding over the same batch.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import torch

from benchmarks.common import cpu_description, dense_base, median_rates, prepare, random_ids, timing_parser
from moe_embed.errors import run_cli
from moe_embed.options import parse


def export_variants(work: Path, graph, inputs: dict) -> dict[str, Path]:
    """Name -> fp32 ONNX file of each graph shape (see the module docstring)."""
    from moe_embed.convert.onnx_graph import export_graph, output_names
    from moe_embed.convert.onnx_layout import eager_attention

    files = {"package": work / "package.onnx"}
    export_graph(graph, inputs, files["package"], None)
    names = list(inputs)
    dynamic = {name: {0: "batch", 1: "sequence"} for name in names}
    for name, eager in (("dynamo", False), ("dynamo, eager attention", True)):
        files[name] = work / f"{name.replace(', ', '-').replace(' ', '_')}.onnx"
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            kwargs = dict(kwargs=dict(inputs), input_names=names, output_names=output_names(graph))
            if eager:
                with eager_attention(graph.model):
                    program = torch.onnx.export(graph, (), dynamic_shapes=dynamic, dynamo=True, **kwargs)
            else:
                program = torch.onnx.export(graph, (), dynamic_shapes=dynamic, dynamo=True, **kwargs)
        program.save(str(files[name]))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                graph,
                (),
                str(work / "torchscript.onnx"),
                kwargs=dict(inputs),
                input_names=names,
                output_names=output_names(graph),
                dynamic_axes=dynamic,
                dynamo=False,
                opset_version=17,
            )
        files["torchscript"] = work / "torchscript.onnx"
    except Exception as error:  # removed from a later torch: the table says so
        print(f"torchscript exporter unavailable: {type(error).__name__}: {str(error)[:200]}")
    return files


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__.split("\n\n")[0], "ignored: the dense --base is exported")
    parser.set_defaults(batch_sizes="32", seq_lens="16,128")
    args = parse(parser, argv)
    import onnxruntime
    from sentence_transformers import SentenceTransformer

    from moe_embed.convert.onnx_graph import SentenceEmbeddingGraph
    from moe_embed.convert.onnx_int8 import quantize, row_cosines

    shapes = prepare(args)
    st = SentenceTransformer(dense_base(args), device="cpu")
    graph = SentenceEmbeddingGraph(st[0].auto_model.eval(), list(st)[1:])
    tokens = st.tokenizer(["an example", "two"], padding=True, return_tensors="pt")
    inputs = {name: tokens[name] for name in ("input_ids", "attention_mask", "token_type_ids")}
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        files = export_variants(Path(tmp), graph, inputs)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        sessions = {}
        quantized = {name: (fp32, True) for name, fp32 in files.items()}
        quantized["package, keys copied"] = (files["package"], False)
        for index, (name, (fp32, keys_read_transposed)) in enumerate(quantized.items()):
            int8 = Path(tmp) / f"{index}.int8.onnx"
            quantize(fp32, int8, keys_read_transposed=keys_read_transposed)
            sessions[name] = onnxruntime.InferenceSession(str(int8), options, providers=["CPUExecutionProvider"])
        print(
            f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {threads} threads; {cpu_description()}"
        )
        print("| batch | tokens | torch (seq/s) | " + " | ".join(f"{name} int8" for name in sessions) + " |")
        print("|---:|---:|---:|" + "---:|" * len(sessions))
        for batch_size, seq_len in shapes:
            generator = torch.Generator().manual_seed(0)
            ids = random_ids(graph.model.config.vocab_size, batch_size, seq_len, generator)
            feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
            arrays = {k: v.numpy() for k, v in feed.items()}
            runs = {"torch": lambda **f: graph(**{k: torch.from_numpy(v) for k, v in f.items()})}
            for name, session in sessions.items():
                runs[name] = lambda session=session, **f: session.run(["sentence_embedding"], f)
            rates = median_rates(runs, arrays, args.repeats, args.min_time)
            with torch.no_grad():
                reference = graph(**feed)[0].numpy()
            cells = []
            for name, session in sessions.items():
                cosine = row_cosines(session.run(["sentence_embedding"], arrays)[0], reference).min()
                cells.append(f"{rates[name]:.1f} ({rates[name] / rates['torch']:.2f}x, cos {cosine:.4f})")
            print(f"| {batch_size} | {seq_len} | {rates['torch']:.1f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    run_cli(main)
