"""int8 beside the fp32 graph: onnxruntime dynamic quantisation, measured against fp32 on real texts.

The setting is the one measured best on a routed MoTE graph (`benchmarks/int8_settings.py`, table in
`docs/serving.md`): QInt8 weights quantised per output channel, MatMul only, no
reduce_range, which is what sentence-transformers' `avx512_vnni` configuration chooses; per-tensor weights
fall to cosine 0.938 on some rows. The file is named as sentence-transformers names that variant
(`onnx/model_qint8_avx512_vnni.onnx`), so `backend="onnx", model_kwargs={"file_name": ...}` and fastembed's
`model_file` find it. Activations are quantised at run time per tensor (`DynamicQuantizeLinear`): no
calibration data. The quantised graph then reads attention's keys transposed in the matmul
(`convert/onnx_layout.py`, `transposed_operands_in_matmul`): an onnxruntime operator, in onnxruntime's file.

Agreement is the cosine of each row's int8 embedding to the fp32 graph's, over `agreement_texts.txt`
(47 English sentences written for this check: questions, reviews, news, captions, two one-word texts) and
one long text made of them (cut at the input length), each sent without a prompt and with every prompt the
folder defines, so every expert and the longest inputs are exercised.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

INT8_FILE = "model_qint8_avx512_vnni.onnx"
# what every router's weight is named with (`router.weight`): both int8 paths leave those matmuls in fp32
ROUTER_NAME = ".router."
AGREEMENT_TEXTS = Path(__file__).resolve().parent / "agreement_texts.txt"


def quantize(
    fp32: Path,
    int8: Path,
    weights: str = "QInt8",
    per_channel: bool = True,
    reduce_range: bool = False,
    operators: tuple[str, ...] = ("MatMul",),
    keys_read_transposed: bool = True,
) -> None:
    """Dynamic int8 quantisation of `fp32` to `int8`; the defaults are the chosen setting (per-channel QInt8
    MatMul weights, attention's keys read transposed by the matmul), the others are what
    `benchmarks/int8_settings.py` and `benchmarks/int8_graphs.py` compare it with."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.disable(logging.INFO)  # the quantiser logs every tensor it skips at INFO on the root logger
    try:
        quantize_dynamic(
            str(fp32),
            str(int8),
            weight_type=getattr(QuantType, weights),
            per_channel=per_channel,
            reduce_range=reduce_range,
            op_types_to_quantize=list(operators),
            nodes_to_exclude=router_nodes(fp32),
        )
    finally:
        logging.disable(logging.NOTSET)
    if keys_read_transposed:  # onnxruntime's quantiser writes only to a path: read it back once to rewrite
        import onnx

        from moe_embed.convert.onnx_layout import transposed_operands_in_matmul

        model = onnx.load(str(int8))
        if transposed_operands_in_matmul(model):
            onnx.save(model, str(int8))


def router_nodes(path: Path) -> list[str]:
    """The nodes that multiply by a router's weight: they stay fp32, as the model computes routers in fp32, since
    an int8 router's rounding could send a token to other experts than the fp32 graph's."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return [node.name for node in model.graph.node if any(ROUTER_NAME in name for name in node.input[1:])]


def agreement_texts(prompts: dict[str, str]) -> list[str]:
    """The agreement texts and one long text made of them (cut at the input length), plain and behind each
    distinct prompt."""
    texts = [line for line in AGREEMENT_TEXTS.read_text(encoding="utf-8").splitlines() if line.strip()]
    texts.append(" ".join(texts))
    return texts + [prompt + text for prompt in dict.fromkeys(prompts.values()) for text in texts]


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


__all__ = ["INT8_FILE", "ROUTER_NAME", "quantize", "agreement_texts", "row_cosines"]
