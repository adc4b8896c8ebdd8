"""The checks every ONNX export passes before its folder is written: the graph against the PyTorch graph (every
output, on batches unlike the traced example) and, fed as a client feeds it, against
`SentenceTransformer.encode` with every prompt and none; the int8 graph's agreement with fp32.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from moe_embed.convert.cpu_graph import GRAPH_FILE
from moe_embed.convert.onnx_graph import SentenceEmbeddingGraph, embed, graph_inputs, run_graph, session
from moe_embed.errors import UsageError

logger = logging.getLogger(__name__)

CHECK_TEXTS = [
    "Isaac Newton formulated the laws of motion and universal gravitation.",
    "stocks fell",
    "A man is playing a guitar on a stage in front of a large and cheering crowd tonight.",
    "how do plants make energy?",
    "hi",
    " ".join(["The quick brown fox jumps over the lazy dog."] * 60),  # over every max_seq_length here
]


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
        mask = inputs["attention_mask"].numpy().astype(bool)
        for index, (a, b) in enumerate(zip(got, expected, strict=True)):  # token states: real positions only
            worst = max(worst, max_difference(a, b, mask if index == 1 else None))
    return worst


def check_against_encode(runner, model, tokenizer, task: str | None) -> float:
    """Largest |graph - `model.encode`| over texts sent as a client sends them (tokenised by `tokenizer`,
    the folder's `tokenizer.json`): without a prompt and with each prompt (a one-task graph: `task=` its task)."""
    worst = 0.0
    config = model[0].auto_model.config
    prompts = dict(model.prompts or {})
    cases = [(None, "")] if task or getattr(config, "default_task", True) is not None else []  # strict: no
    distinct = {}  # a prompt text once (names with the same text embed alike): under its first name
    for name, prompt in prompts.items():
        distinct.setdefault(prompt, name)
    cases += [(name, prompt) for prompt, name in distinct.items()]
    for name, prompt in cases:
        got = embed(runner, tokenizer, [prompt + text for text in CHECK_TEXTS])
        kwargs = {"prompt_name": name} if name else {}
        if task:
            kwargs["task"] = task
        worst = max(worst, max_difference(got, model.encode(CHECK_TEXTS, **kwargs)))
    return worst


def check_export(runner, graph: SentenceEmbeddingGraph, st, client, example: dict, tolerance: float) -> float:
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
    if not max(worst, encoded) <= tolerance:
        raise UsageError(f"the graph differs from PyTorch by {max(worst, encoded):.2e} > --tolerance {tolerance:g}")
    return max(worst, encoded)


def quantize_checked(folder: Path, fp32_runner, st, client, min_cosine: float, variants: list[str]) -> dict:
    """Write the int8 graphs beside the fp32 one (`fp32_runner`: its session): onnxruntime's for each CPU family of
    `variants`, and OpenVINO's where the `openvino` extra is installed; refuse when a row's cosine to fp32 is below
    the bound."""
    import tempfile

    from moe_embed.convert.onnx_int8 import Int8Fit

    logger.info("quantising to int8 for %s", ", ".join(variants))
    with tempfile.TemporaryDirectory(prefix="int8-") as scratch:
        fit = Int8Fit(folder / GRAPH_FILE, Path(scratch), calibration_halves(fp32_runner, st, client, min_cosine))
        result = onnxruntime_quantized(folder, fit, fp32_runner, st, client, min_cosine, variants)
        openvino = openvino_quantized(folder, fit, client, st, result.pop("reference"), min_cosine)
    return {**result, "openvino": openvino} if openvino else result


def onnxruntime_quantized(folder: Path, fit, fp32_runner, st, client, min_cosine: float, variants: list[str]) -> dict:
    """onnxruntime's int8 graph of each of `variants`, fitted by `fit` (`onnx_int8.Int8Fit`), with its agreement
    on the agreement texts; `reference`: their fp32 embeddings, for OpenVINO's."""
    from moe_embed.convert.onnx_int8 import INT8_VARIANTS, agreement_texts, write_variants

    graphs = write_variants(fit, variants)
    texts = agreement_texts(st.prompts or {})
    fp32 = embed(fp32_runner, client, texts)
    by_file = {}
    for first, written in graphs.items():  # one agreement per distinct graph: the files of a setting are one graph
        quantized = embed(session(folder / "onnx" / first), client, texts)
        agreement = {**int8_agreement(f"onnx/{first}", quantized, fp32, min_cosine), **written["fit"]}
        by_file.update(dict.fromkeys(written["files"], agreement))
    result = {"texts": len(texts), "variants": {}}
    for name in variants:
        variant = INT8_VARIANTS[name]
        agreement = by_file[variant.file_name]
        result["variants"][name] = {
            "file": f"onnx/{variant.file_name}",
            "weights": variant.weights,
            "per_channel": variant.per_channel,
            "min_cosine": agreement["min_cosine"],
            "mean_cosine": agreement["mean_cosine"],
            **{key: agreement[key] for key in ("smoothquant", "fp32_inputs", "inputs") if key in agreement},
        }
    return {**result, "reference": (texts, fp32)}


def calibration_halves(fp32_runner, st, client, min_cosine: float):
    """The calibration texts, halved (`onnx_int8.Calibration`): feeds of one half fit the int8 graph, the other
    half, plain and behind every prompt, checks it."""
    from moe_embed.convert.onnx_int8 import Calibration
    from moe_embed.convert.openvino_int8 import ROUTED_TEXTS_PER_BATCH, calibration_feeds, calibration_texts

    texts, prompts = calibration_texts(), st.prompts or {}
    inputs = {entry.name for entry in fp32_runner.get_inputs()}
    routed = st[0].auto_model.config.model_type in ("moe_bert", "comoe_bert")  # tokens pick the experts
    feeds = calibration_feeds(client, prompts, inputs, ROUTED_TEXTS_PER_BATCH if routed else 2, texts[0::2])
    held_out = texts[1::2]
    # texts of every length a client sends: a few tokens behind a prompt fared worst in int8 (MPNet's special rows)
    held_out += [" ".join(text.split()[:words]) for text in held_out[:8] for words in (1, 2, 4)]
    check = [prompt + text for prompt in dict.fromkeys(["", *prompts.values()]) for text in held_out]
    return Calibration(feeds, check, client, min_cosine)


def openvino_quantized(folder: Path, fit, client, st, reference, min_cosine: float) -> dict | None:
    """OpenVINO's static int8 (`convert/openvino_int8.py`) of the graph `fit` gives it (`Int8Fit.openvino_source`),
    with its agreement to the fp32 embeddings `reference` (`(texts, embeddings)`), or None without the extra."""
    from moe_embed.convert import cpu_graph, openvino_int8

    if not openvino_int8.available():
        logger.info("OpenVINO or NNCF not installed: no OpenVINO int8 model (pip install 'moe-embed[openvino]')")
        return None
    logger.info("quantising for OpenVINO with NNCF (%s)", openvino_int8.OPENVINO_INT8_FILE)
    xml = folder / openvino_int8.OPENVINO_INT8_FILE
    source, kept_in_fp32 = fit.openvino_source()
    openvino_int8.quantize_openvino(source, xml, client, st.prompts or {}, kept_in_fp32, smoothed=source != fit.fp32)
    texts, fp32 = reference
    quantized = embed(openvino_int8.OpenVinoSession(xml), client, texts)
    family, flags = cpu_graph.cpu_family(), cpu_graph.cpu_flags()
    if not (family and family.openvino_int8):  # written for the CPUs it pays on; said where it does not
        logger.warning(
            "%s is slower than OpenVINO's fp32 on this %s: serve %s with OpenVINO here (docs/serving.md)",
            openvino_int8.OPENVINO_INT8_FILE,
            cpu_graph.describe(family, flags),
            GRAPH_FILE,
        )
    return int8_agreement(openvino_int8.OPENVINO_INT8_FILE, quantized, fp32, min_cosine)


def int8_agreement(file: str, quantized, fp32, min_cosine: float) -> dict:
    """Cosine of each int8 row to its fp32 row; refuse below `min_cosine`."""
    from moe_embed.convert.onnx_int8 import row_cosines

    cos = row_cosines(quantized, fp32)
    agreement = {"file": file, "texts": len(fp32), "min_cosine": round(float(cos.min()), 4)}
    agreement["mean_cosine"] = round(float(cos.mean()), 4)
    logger.info("%s against fp32 over %d texts: cosine min %.4f, mean %.4f", file, len(fp32), cos.min(), cos.mean())
    if not cos.min() >= min_cosine:
        raise UsageError(
            f"the int8 model {file}: its cosine to fp32 falls to {cos.min():.4f} < --int8-min-cosine {min_cosine:g} "
            f"(mean {cos.mean():.4f}); export without --quantize or accept a lower bound"
        )
    return agreement
