"""Which onnxruntime dynamic-quantisation settings keep a routed MoTE graph close to its fp32 embeddings.

    python -m benchmarks.int8_settings                    # MiniLM upcycled to MoTE, exported, then quantised
    python -m benchmarks.int8_settings --texts 128

The bundled MiniLM is upcycled to MoTE and exported routed (`moe-embed export`); each setting
(weight type, per-channel, reduce_range, operators) is applied by `onnxruntime.quantization.quantize_dynamic`
and scored by the cosine of each row's int8 embedding to the fp32 graph's, over STS-B dev sentences (half
of them with the query prefix, so two experts are used; mteb/stsbenchmark-sts's validation split, from
`--data-dir`, else the Hub). It prints min and mean cosine per setting; no timings (they belong in a
benchmark that interleaves rounds).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import add_base_option
from moe_embed.convert.export_onnx import ExportOptions, export_onnx
from moe_embed.convert.onnx_graph import embed, session
from moe_embed.convert.onnx_int8 import quantize, row_cosines
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.data import DATA_DIR_HELP, data_dir, load
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

SETTINGS = [  # (weights, per_channel, reduce_range, operators)
    ("QInt8", False, False, ("MatMul",)),
    ("QInt8", True, False, ("MatMul",)),
    ("QInt8", False, True, ("MatMul",)),
    ("QInt8", False, False, ("MatMul", "Gather")),
    ("QUInt8", False, False, ("MatMul",)),
    ("QInt8", True, False, ("MatMul", "Gather")),
]


def main(argv: list[str] | None = None) -> None:
    parser = add_base_option(command_parser(__doc__))
    parser.add_argument("--texts", type=int, default=256, help="STS-B dev sentence pairs to embed")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    args = parse(parser, argv)
    from tokenizers import Tokenizer

    rows = load("mteb/stsbenchmark-sts", None, "validation", folder=data_dir(args.data_dir), purpose="int8 settings")
    pairs = rows[: args.texts]  # column -> the first --texts values
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        upcycle(upcycle_options(output=work / "mote", base=args.base))
        export_onnx(ExportOptions(model_dir=work / "mote", output=work / "onnx"))
        fp32 = work / "onnx" / "onnx" / "model.onnx"
        tokenizer = Tokenizer.from_file(str(work / "onnx" / "tokenizer.json"))  # as a client tokenises
        texts = pairs["sentence1"] + ["search_query: " + text for text in pairs["sentence2"]]
        reference = embed(session(fp32), tokenizer, texts, batch_size=64)
        print("| weights | per-channel | reduce_range | ops | min cos | mean cos |\n|---|---|---|---|---:|---:|")
        for weights, per_channel, reduce_range, operators in SETTINGS:
            path = work / "int8.onnx"
            quantize(fp32, path, weights, per_channel, reduce_range, operators)
            cos = row_cosines(embed(session(path), tokenizer, texts, batch_size=64), reference)
            print(
                f"| {weights} | {'yes' if per_channel else 'no'} | {'yes' if reduce_range else 'no'} | "
                f"{', '.join(operators)} | {cos.min():.4f} | {cos.mean():.4f} |",
                flush=True,
            )


if __name__ == "__main__":
    run_cli(main)
