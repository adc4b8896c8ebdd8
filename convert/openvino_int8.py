"""OpenVINO's own int8 beside the ONNX graphs: static quantisation by NNCF with a calibration set.

OpenVINO runs the dynamic-quantisation ONNX file (`onnx_int8.py`) no faster than fp32: it is written for
onnxruntime's `DynamicQuantizeLinear` / `MatInteger` kernels. OpenVINO's int8 path is static: NNCF inserts
`FakeQuantize` on the weights and on the activations that feed them, with ranges measured on calibration
data, and the CPU plug-in runs those matmuls in int8. This is what sentence-transformers'
`export_static_quantized_openvino_model` does through optimum-intel; here NNCF quantises the exported ONNX
graph directly (routing, prompts and pooling included), and the result is saved under sentence-transformers'
file name, `openvino/openvino_model_qint8_quantized.xml` (+ `.bin`), weights kept in fp32 where not int8.

Calibration: `calibration_texts.txt` (48 English sentences written for it, none of them among the agreement
texts) and four long texts made of them (cut at the input length), plain and behind each distinct prompt,
fed as a client feeds them (padding included), every batch holding every prompt, so every expert and the
prompt handling see data in every batch. Routers are left out of quantisation (`ignored_scope`): an int8
router could send a token to other experts than the fp32 graph does.

Tokens, not prompts, pick a token-routed graph's experts: its batches hold more texts (`ROUTED_TEXTS_PER_BATCH`),
so that every expert gets tokens in (nearly) every batch. NNCF measures an input's range per batch and averages
over batches; an expert that gets no token in a batch reports the float32 extremes there, the average overflows
(numpy's and NNCF's RuntimeWarnings), and the input gets an empty range, [0, 0], which would quantise all of its
values to zero. Such inputs (an expert the calibration texts rarely or never reach) are left in float32 (their
weights stay int8), and one log line says how many: no warning reaches the user.
"""

from __future__ import annotations

import contextlib
import io
import logging
import warnings
from pathlib import Path
from types import SimpleNamespace

logger = logging.getLogger(__name__)

OPENVINO_INT8_FILE = "openvino/openvino_model_qint8_quantized.xml"
CALIBRATION_TEXTS = Path(__file__).resolve().parent / "calibration_texts.txt"
# texts per calibration batch of a token-routed graph (each text once: such a graph has no prompt to vary); at
# about 12 tokens a sentence, 16 texts give every expert of 8 at top-2 some 50 tokens a batch
ROUTED_TEXTS_PER_BATCH = 16


def available() -> bool:
    """Whether OpenVINO and NNCF are installed (the `openvino` extra)."""
    import importlib.util

    return all(importlib.util.find_spec(name) is not None for name in ("openvino", "nncf"))


def calibration_texts() -> list[str]:
    """The calibration texts (`calibration_texts.txt`) and four long texts made of them: activations over hundreds
    of tokens reach ranges that sentences do not."""
    lines = CALIBRATION_TEXTS.read_text(encoding="utf-8").splitlines()
    texts = [line for line in lines if line.strip()]
    return texts + [" ".join(texts[start:] + texts[:start]) for start in range(0, len(texts), len(texts) // 4)]


def calibration_feeds(
    client, prompts: dict[str, str], input_names: set[str], per_batch: int = 2, texts: list[str] | None = None
) -> list[dict]:
    """The calibration texts (`texts`: default all of `calibration_texts()`) as client feeds (numpy, by input
    name): each batch holds `per_batch` texts, each plain and behind every distinct prompt, so that every task
    expert gets rows in every batch (a statistic over an expert's empty input is undefined and spoils its
    ranges)."""
    from moe_embed.convert.onnx_graph import graph_inputs

    texts = calibration_texts() if texts is None else texts
    variants = list(dict.fromkeys(["", *prompts.values()]))  # an empty prompt is the plain text
    feeds = []
    for start in range(0, len(texts), per_batch):
        batch = [prompt + text for text in texts[start : start + per_batch] for prompt in variants]
        feed = graph_inputs(client, batch)
        feeds.append({name: value.numpy() for name, value in feed.items() if name in input_names})
    return feeds


def quantize_openvino(
    fp32: Path, xml: Path, client, prompts: dict[str, str], keep: list[str] = (), smoothed: bool = False
) -> None:
    """Statically quantise the ONNX graph `fp32` with NNCF on the calibration texts (tokenized by `client`, behind
    each of `prompts`), the nodes `keep` and the routers left in fp32, and save it as `xml` (+ `.bin`). A graph
    whose activations are `smoothed` already (`onnx_smoothing.py`) is not smoothed again by NNCF."""
    import nncf
    import openvino

    logging.getLogger("nncf").setLevel(logging.WARNING)  # it logs every step at INFO
    model = openvino.Core().read_model(str(fp32))
    routers = [op.get_friendly_name() for op in model.get_ops() if is_router(op)]
    inputs = {value.get_any_name() for value in model.inputs}
    feeds = calibration_feeds(client, prompts, inputs, ROUTED_TEXTS_PER_BATCH if routers else 2)
    # NNCF draws its progress bars on stdout, whatever its log level: a converter's stdout is its result line;
    # its RuntimeWarnings are those of inputs without calibration data, handled below
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        ignored = [*routers, *keep]
        quantized = nncf.quantize(
            model,
            nncf.Dataset(feeds),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(feeds),
            ignored_scope=nncf.IgnoredScope(names=ignored, validate=False) if ignored else None,
            advanced_parameters=nncf.AdvancedQuantizationParameters(
                smooth_quant_alphas=nncf.AdvancedSmoothQuantParameters(matmul=-1)
            )
            if smoothed
            else None,
        )
    for warning in caught:  # anything but NNCF's numeric warnings goes on as it came
        if not issubclass(warning.category, RuntimeWarning):
            warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    numeric = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    unmeasured = keep_unmeasured_inputs_in_fp32(quantized)
    if unmeasured or numeric:
        logger.info(
            "OpenVINO int8: %d inputs without a measurable range (experts that calibration tokens reached in too "
            "few batches; %d numeric warnings from NNCF) stay in float32, their weights int8",
            unmeasured,
            len(numeric),
        )
    xml.parent.mkdir(parents=True, exist_ok=True)
    openvino.save_model(quantized, str(xml), compress_to_fp16=False)


def keep_unmeasured_inputs_in_fp32(model) -> int:
    """Bypass each activation `FakeQuantize` of `model` whose range is empty (low == high: NNCF's range of an
    input whose statistics were undefined), so that its input stays float32; returns how many."""
    import numpy as np

    bypassed = 0
    for op in model.get_ordered_ops():
        if op.get_type_name() != "FakeQuantize" or op.input_value(0).get_node().get_type_name() == "Constant":
            continue  # a weight's quantiser: its range is the weight's own
        low, high = (op.input_value(i).get_node() for i in (1, 2))
        if low.get_type_name() != "Constant" or high.get_type_name() != "Constant":
            continue
        if np.all(high.get_data() <= low.get_data()):
            op.output(0).replace(op.input_value(0))
            bypassed += 1
    return bypassed


def is_router(op) -> bool:
    """A matmul by a router's weight (its constant input is named after it)."""
    from moe_embed.convert.onnx_int8 import ROUTER_NAME

    if op.get_type_name() != "MatMul":
        return False
    for value in op.input_values():
        names = value.get_names() | {value.get_node().get_friendly_name()}
        if any(ROUTER_NAME in name for name in names):
            return True
    return False


class OpenVinoSession:
    """An OpenVINO CPU model of an `.xml` (or ONNX) file behind onnxruntime's `InferenceSession` calls
    (`get_inputs`, `run`), so that what embeds through a session (`onnx_graph.embed`, the benchmarks' mteb
    encoder) embeds through OpenVINO too."""

    def __init__(self, path: Path, threads: int | None = None, precision: str | None = None):
        import openvino

        config = {"INFERENCE_NUM_THREADS": threads} if threads else {}
        if precision:
            config["INFERENCE_PRECISION_HINT"] = precision
        self.model = openvino.Core().compile_model(str(path), "CPU", config)
        self.inputs = [SimpleNamespace(name=i.get_any_name()) for i in self.model.inputs]
        self.outputs = [o.get_any_name() for o in self.model.outputs]

    def get_inputs(self) -> list:
        return self.inputs

    def run(self, output_names, feed: dict) -> list:
        result = self.model(feed)
        return [result[name] for name in output_names or self.outputs]


__all__ = ["OPENVINO_INT8_FILE", "available", "calibration_feeds", "quantize_openvino", "OpenVinoSession"]
