"""Exported folders in the engines people serve with, none of which knows this package: fastembed (in a
venv of its own, with no code of this package and no torch) and OpenVINO. Each gives the PyTorch model's
embeddings: MoTE with each task's prompt, none and a mixed batch; the token MoE and CoMoE."""

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, TEXTS, client_feed
from sentence_transformers import SentenceTransformer

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)
FASTEMBED_PYTHON = Path(os.environ.get("MOE_EMBED_FASTEMBED_PYTHON", REPO / ".venv-fastembed" / "bin" / "python"))

# the folder README's fastembed snippet, for several folders in one process
FASTEMBED = """
import json, sys
from fastembed import TextEmbedding
from fastembed.common.model_description import ModelSource, PoolingType

texts = json.loads(sys.argv[1])
result = {}
for index, folder in enumerate(sys.argv[2:]):
    config = json.load(open(folder + "/onnx_config.json"))
    name = f"local/moe-embed-{index}"
    TextEmbedding.add_custom_model(model=name, pooling=PoolingType.DISABLED, normalization=True,
                                   sources=ModelSource(hf=name), dim=config["dimension"],
                                   model_file="onnx/model.onnx")
    model = TextEmbedding(name, specific_model_path=folder)
    result[folder] = [e.tolist() for e in model.embed(texts)]
print(json.dumps(result))
"""


def mote_texts(st) -> list[str]:
    """Every prompt (each task's), none, a long text: mixed in one list, as a client sends them."""
    names = [*st.prompts, None, None, "query"]
    texts = [TEXTS[i % len(TEXTS)] for i in range(len(names) - 1)] + [LONG]
    return [(st.prompts[n] if n else "") + t for n, t in zip(names, texts, strict=True)]


def expected_embeddings(st, sent: list[str]) -> np.ndarray:
    """`encode` of each text as sent (a leading prompt routes MoTE, as its module reads it)."""
    return np.stack([st.encode([text])[0] for text in sent])


def test_fastembed_loads_the_folders_and_embeds_as_pytorch(
    trained_mote, mote_onnx, moe_dir, moe_onnx, comoe_dir, comoe_onnx
):
    assert FASTEMBED_PYTHON.is_file(), f"{FASTEMBED_PYTHON} missing: run bash scripts/setup_env.sh"
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    sent = mote_texts(st)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)} | {"HF_HUB_OFFLINE": "1"}
    folders = [str(mote_onnx), str(moe_onnx), str(comoe_onnx)]
    done = subprocess.run(
        [str(FASTEMBED_PYTHON), "-c", FASTEMBED, json.dumps(sent), *folders],
        cwd="/",  # nothing of this repository on the path; fastembed's venv has no torch and no moe-embed
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.splitlines()[-1])
    assert np.abs(np.array(got[folders[0]]) - expected_embeddings(st, sent)).max() <= 1e-4
    for source, folder in ((moe_dir, folders[1]), (comoe_dir, folders[2])):
        model = SentenceTransformer(source, trust_remote_code=True)
        assert np.abs(np.array(got[folder]) - expected_embeddings(model, sent)).max() <= 1e-4, folder


@pytest.mark.parametrize("family", ["mote", "moe", "comoe"])
def test_openvino_reads_the_graph_and_embeds_as_pytorch(family, request):
    import openvino

    source, folder = {
        "mote": ("trained_mote", "mote_onnx"),
        "moe": ("moe_dir", "moe_onnx"),
        "comoe": ("comoe_dir", "comoe_onnx"),
    }[family]
    source, folder = request.getfixturevalue(source), request.getfixturevalue(folder)
    st = SentenceTransformer(str(source), trust_remote_code=True)
    sent = mote_texts(st)
    feed = client_feed(folder, sent)
    core = openvino.Core()
    # the CPU plug-in runs bf16 where the CPU has it unless told f32 (docs/serving.md §3.2)
    compiled = core.compile_model(str(folder / "onnx" / "model.onnx"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    inputs = {i.get_any_name() for i in compiled.inputs}
    got = compiled({k: v for k, v in feed.items() if k in inputs})["sentence_embedding"]
    assert np.abs(got - expected_embeddings(st, sent)).max() <= 1e-4
    # both int8 models run in OpenVINO, close to fp32 as the exporter measured them: onnxruntime's int8 graph and
    # OpenVINO's own (NNCF static int8, sentence-transformers' file name)
    recorded = json.loads((folder / "onnx_config.json").read_text())["int8"]
    for file, bound in [
        ("onnx/model_qint8_avx512_vnni.onnx", recorded["variants"]["avx512_vnni"]["min_cosine"]),
        ("onnx/model_quint8_avx2.onnx", recorded["variants"]["avx2"]["min_cosine"]),
        ("openvino/openvino_model_qint8_quantized.xml", recorded["openvino"]["min_cosine"]),
    ]:
        quantized = core.compile_model(str(folder / file), "CPU")({k: v for k, v in feed.items() if k in inputs})
        quantized = quantized["sentence_embedding"]
        cos = (quantized * got).sum(1) / np.linalg.norm(quantized, axis=1) / np.linalg.norm(got, axis=1)
        assert cos.min() >= bound - 0.01, file
    # its routers stay fp32: no FakeQuantize in front of a router's matmul
    from moe_embed.convert.openvino_int8 import is_router

    int8 = core.read_model(str(folder / "openvino/openvino_model_qint8_quantized.xml"))
    routers = [op for op in int8.get_ops() if is_router(op)]
    config = json.loads((Path(source) / "config.json").read_text())  # the source's: the export's is a plain BERT's
    # none in MoTE, one per MoE layer, one per CoMoE linear (four a layer)
    assert (
        len(routers)
        == {"mote": 0, "moe": len(config.get("moe_layers", [])), "comoe": 4 * config["num_hidden_layers"]}[family]
    )
    for op in routers:
        assert all(v.get_node().get_type_name() != "FakeQuantize" for v in op.input_values()), op.get_friendly_name()
