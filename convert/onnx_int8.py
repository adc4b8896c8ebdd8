"""int8 beside the fp32 graph: onnxruntime dynamic quantisation, one graph per CPU family, measured against fp32.

A graph's int8 kernels are the CPU's: onnxruntime multiplies uint8 activations by int8 weights with VNNI's
`vpdpbusd` on AVX-512 VNNI (and AMX) CPUs, and by `vpmaddubsw` without VNNI, while uint8 weights take another
kernel. sentence-transformers therefore writes one graph per instruction set, each with the setting optimum's
`AutoQuantizationConfig.<name>(is_static=False)` gives it, and names it `onnx/model_<weights>_<name>.onnx`
(`INT8_VARIANTS`): `avx512_vnni`, `avx512` and `arm64` quantise weights to QInt8, `avx2` to QUInt8, all per
output channel, without reduce_range. The export writes the same files, so that `backend="onnx",
model_kwargs={"file_name": ...}` and fastembed's `model_file` find them, and `convert/cpu_graph.py` picks one for the
CPU a folder is served on. Variants with the same setting are one graph written under each name (a hard link where
the file system has them). Per-channel weights were measured best on a routed MoTE graph
(`benchmarks/int8_settings.py`, table in `docs/serving.md`); per-tensor weights fall to cosine 0.938 on some
rows. Activations are quantised at run time per tensor (`DynamicQuantizeLinear`): no calibration data. The
quantised graph then reads attention's keys transposed in the matmul (`convert/onnx_layout.py`,
`transposed_operands_in_matmul`): an onnxruntime operator, in onnxruntime's file.

Agreement is the cosine of each row's int8 embedding to the fp32 graph's, over `agreement_texts.txt`
(47 English sentences written for this check: questions, reviews, news, captions, two one-word texts) and
one long text made of them (cut at the input length), each sent without a prompt and with every prompt the
folder defines, so every expert and the longest inputs are exercised. It is measured once per distinct setting,
on the exporting CPU's kernels.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Int8Variant:
    """One of sentence-transformers' int8 graphs: the CPU family it is named for and its quantisation setting."""

    name: str
    weights: str  # onnxruntime's `QuantType` of the weights: QInt8 or QUInt8
    per_channel: bool = True
    reduce_range: bool = False

    @property
    def file_name(self) -> str:
        """The file's name in the folder's `onnx/`, as sentence-transformers' `export_dynamic_quantized_onnx_model`
        names it: `model_qint8_avx512_vnni.onnx`."""
        return f"model_{self.weights.lower()}_{self.name}.onnx"

    @property
    def setting(self) -> tuple:
        return self.weights, self.per_channel, self.reduce_range


INT8_VARIANTS = {
    variant.name: variant
    for variant in (
        Int8Variant("avx512_vnni", "QInt8"),
        Int8Variant("avx512", "QInt8"),
        Int8Variant("avx2", "QUInt8"),
        Int8Variant("arm64", "QInt8"),
    )
}
INT8_FILE = INT8_VARIANTS["avx512_vnni"].file_name
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


def write_variants(fp32: Path, names: list[str]) -> dict[str, list[str]]:
    """Quantise `fp32` once per distinct setting of the variants `names` and write each variant's file beside it;
    returns the file names of each setting's graph, the quantised one first (its agreement is theirs)."""
    import os
    import shutil

    groups: dict[tuple, list[str]] = {}
    for name in names:
        groups.setdefault(INT8_VARIANTS[name].setting, []).append(INT8_VARIANTS[name].file_name)
    for (weights, per_channel, reduce_range), files in groups.items():
        first = fp32.parent / files[0]
        quantize(fp32, first, weights=weights, per_channel=per_channel, reduce_range=reduce_range)
        for other in files[1:]:
            try:
                os.link(first, fp32.parent / other)
            except OSError:  # a file system without hard links
                shutil.copyfile(first, fp32.parent / other)
    return {files[0]: files for files in groups.values()}


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


__all__ = [
    "INT8_FILE",
    "INT8_VARIANTS",
    "Int8Variant",
    "write_variants",
    "ROUTER_NAME",
    "quantize",
    "agreement_texts",
    "row_cosines",
]
