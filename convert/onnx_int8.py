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

logger = logging.getLogger(__name__)


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
    exclude: list[str] = (),
) -> None:
    """Dynamic int8 quantisation of `fp32` to `int8`, the nodes `exclude` and the routers left in fp32; the defaults
    are the chosen setting (per-channel QInt8 MatMul weights, attention's keys read transposed by the matmul), the
    others are what `benchmarks/int8_settings.py` and `benchmarks/int8_graphs.py` compare it with."""
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
            nodes_to_exclude=router_nodes(fp32) + list(exclude),
        )
    finally:
        logging.disable(logging.NOTSET)
    if keys_read_transposed:  # onnxruntime's quantiser writes only to a path: read it back once to rewrite
        import onnx

        from moe_embed.convert.onnx_layout import transposed_operands_in_matmul

        model = onnx.load(str(int8))
        if transposed_operands_in_matmul(model):
            onnx.save(model, str(int8))


@dataclass
class Calibration:
    """What an int8 graph is fitted on, from the calibration texts (`openvino_int8.calibration_texts`), which half
    each: `feeds`, client feeds of one half, fit the smoothing; `texts`, the other half and short cuts of some of
    it (one, two and four words), plain and behind every prompt, check the result, embedded as a client sends them
    (`client` tokenises; batches of similar length, as `encode` makes them and as the agreement is measured: a long
    text pads its batch, and in MPNet padded rows carry activations as large as the special tokens', which a
    batch's one int8 scale must span). Every row of the check must keep the bound (plain int8) or `target` (a
    smoothed graph, fitted to the other half). Measured on the texts it was
    fitted to, a smoothed graph looked better than it was (cosine 0.983 there, 0.943 on the agreement texts:
    all-mpnet-base-v2), and a check of sentences alone missed what a few tokens behind a prompt lose."""

    feeds: list[dict]
    texts: list[str]
    client: object
    min_cosine: float

    @property
    def target(self) -> float:
        """What every check row must keep: the bound with a margin of half the loss it allows (0.985 for 0.97), since
        texts neither half holds fare worse (all-mpnet-base-v2's MoTE with 10 of 84 inputs in fp32: 0.987 on a check
        of sentences alone, 0.916 on the agreement texts; with the check's short texts, 40 of 84 keep 0.989 there
        and 0.996 on the agreement texts)."""
        return 1 - (1 - self.min_cosine) / 2


def write_variants(fit: Int8Fit, names: list[str]) -> dict[str, dict]:
    """Quantise `fit.fp32` once per distinct setting of the variants `names` and write each variant's file beside
    it; returns, by the file quantised, the files of its setting (the quantised one first: its agreement is theirs)
    and how it was fitted (`Int8Fit.write`)."""
    import os
    import shutil

    groups: dict[tuple, list[str]] = {}
    for name in names:
        groups.setdefault(INT8_VARIANTS[name].setting, []).append(INT8_VARIANTS[name].file_name)
    written = {}
    for setting, files in groups.items():
        first = fit.fp32.parent / files[0]
        written[files[0]] = {"files": files, "fit": fit.write(first, setting)}
        for other in files[1:]:
            try:
                os.link(first, fit.fp32.parent / other)
            except OSError:  # a file system without hard links
                shutil.copyfile(first, fit.fp32.parent / other)
    return written


class Int8Fit:
    """int8 that keeps the calibration bound: plain dynamic quantisation where it does (BERT's graphs); where it does
    not, the activations smoothed first (SmoothQuant, `onnx_smoothing.py`), and where that is not enough either, the
    matmuls of the inputs int8 keeps worst left in fp32, an eighth of the smoothed inputs more at a time, until every
    check row keeps the bound. The smoothed graph is made once, in `scratch`, for every setting and for OpenVINO's
    int8 (`openvino_source`)."""

    def __init__(self, fp32: Path, scratch: Path, calibration: Calibration | None = None):
        self.fp32, self.scratch, self.calibration = fp32, scratch, calibration
        self.smoothed, self.order, self.reference = None, None, None
        # how many of the smoothed inputs (`order`, worst first) a setting left in fp32: the most any setting left,
        # since each setting starts where the last one stopped
        self.kept_inputs = 0

    def write(self, int8: Path, setting: tuple) -> dict:
        """Write `int8` with `setting` (weights, per_channel, reduce_range); how it was fitted."""
        weights, per_channel, reduce_range = setting
        quantize(self.fp32, int8, weights=weights, per_channel=per_channel, reduce_range=reduce_range)
        # plain int8 fits nothing to the calibration texts: its check is the bound itself (the margin is for fitted
        # graphs), so a graph that keeps the bound stays as fast as plain int8 is (BERT's: 0.970 on the check)
        if self.calibration is None or self.holds(int8, self.calibration.min_cosine):
            return {"smoothquant": False, "fp32_inputs": 0}
        self.smooth()
        # every setting keeps at least what another kept: one measure of which inputs int8 cannot hold
        kept, step = self.kept_inputs, max(1, len(self.order) // 8)
        while True:
            quantize(self.smoothed, int8, weights=weights, per_channel=per_channel, reduce_range=reduce_range,
                     exclude=self.fp32_nodes(kept))  # fmt: skip
            if kept >= len(self.order) or self.holds(int8, self.calibration.target):
                logger.info("int8 %s: activations smoothed, %d of %d matmul inputs in fp32", int8.name, kept,
                            len(self.order))  # fmt: skip
                self.kept_inputs = kept
                return {"smoothquant": True, "fp32_inputs": kept, "inputs": len(self.order)}
            kept = min(len(self.order), kept + step)

    def openvino_source(self) -> tuple[Path, list[str]]:
        """`(graph, matmuls to keep in fp32)` for OpenVINO's int8: the smoothed graph and what onnxruntime's int8
        kept in fp32 where the fit smoothed (all-mpnet-base-v2's OpenVINO int8: cosine 0.927 from the fp32 graph
        with NNCF's own SmoothQuant, 0.978 from this), else the fp32 graph as it is."""
        return (self.smoothed, self.fp32_nodes(self.kept_inputs)) if self.smoothed is not None else (self.fp32, [])

    def fp32_nodes(self, kept: int) -> list[str]:
        """The matmul nodes of the first `kept` smoothed inputs (`order`), which stay fp32."""
        return [node for name in self.order[:kept] for node in self.smoothed_nodes[name]]

    def holds(self, int8: Path, bound: float) -> bool:
        """Whether every check row of `int8` keeps `bound` against the fp32 graph."""
        from moe_embed.convert.onnx_graph import embed, session

        check = self.calibration
        if self.reference is None:
            self.reference = embed(session(self.fp32), check.client, check.texts)
        cosines = row_cosines(embed(session(int8), check.client, check.texts), self.reference)
        logger.info("int8 %s on the calibration check: cosine min %.4f", int8.name, cosines.min())
        return bool(cosines.min() >= bound)

    def smooth(self) -> None:
        if self.smoothed is not None:
            return
        import onnx

        from moe_embed.convert.onnx_smoothing import smooth

        model = onnx.load(str(self.fp32))
        self.smoothed_nodes = smooth(model, self.calibration.feeds, self.scratch, ROUTER_NAME)
        self.order = list(self.smoothed_nodes)
        self.smoothed = self.scratch / "smoothed.onnx"
        onnx.save_model(model, str(self.smoothed), save_as_external_data=True, location="smoothed.onnx.data")


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
    "Calibration",
    "Int8Fit",
    "write_variants",
    "ROUTER_NAME",
    "quantize",
    "agreement_texts",
    "row_cosines",
]
