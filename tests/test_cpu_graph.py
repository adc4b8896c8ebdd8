"""int8 per CPU family: the export's variants (names and settings as sentence-transformers writes them) and the
choice of graph where a folder is served (`convert/cpu_graph.py`), by the CPU's flags, never by a timing."""

from __future__ import annotations

import json
import logging
import platform
from pathlib import Path

import numpy as np
import pytest

from moe_embed.convert.cpu_graph import FAMILIES, cpu_family, cpu_flags, family_file, serving_file
from moe_embed.convert.onnx_int8 import INT8_VARIANTS

FAMILY = {family.name: family for family in FAMILIES}


def weight_types(path: Path) -> set[str]:
    """The element types of the weights the graph's integer matmuls read (`MatMulInteger`'s second input)."""
    import onnx

    model = onnx.load(str(path))
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    names = [node.input[1] for node in model.graph.node if node.op_type == "MatMulInteger"]
    return {onnx.TensorProto.DataType.Name(initializers[name].data_type) for name in names if name in initializers}


def test_export_writes_each_family_its_graph_with_sentence_transformers_setting(mote_onnx):
    files = {name: mote_onnx / "onnx" / variant.file_name for name, variant in INT8_VARIANTS.items()}
    assert sorted(path.name for path in files.values()) == [
        "model_qint8_arm64.onnx",
        "model_qint8_avx512.onnx",
        "model_qint8_avx512_vnni.onnx",
        "model_quint8_avx2.onnx",
    ]
    assert weight_types(files["avx512_vnni"]) == {"INT8"}  # u8 activations x s8 weights: VNNI's vpdpbusd
    assert weight_types(files["avx2"]) == {"UINT8"}  # u8 x u8, optimum's avx2 setting
    # the same setting is one graph under three names; the other setting is another graph
    same = {files[name].read_bytes() for name in ("avx512_vnni", "avx512", "arm64")}
    assert len(same) == 1 and files["avx2"].read_bytes() not in same
    recorded = json.loads((mote_onnx / "onnx_config.json").read_text())["int8"]["variants"]
    assert {name: v["file"] for name, v in recorded.items()} == {n: f"onnx/{p.name}" for n, p in files.items()}


@pytest.mark.parametrize(
    ("flags", "machine", "family"),
    [
        ({"avx2", "avx512f", "avx512bw", "avx512_vnni"}, "x86_64", "avx512_vnni"),
        ({"avx2", "avx512f", "avx512bw", "amx_int8"}, "x86_64", "avx512_vnni"),
        ({"avx2", "avx512f", "avx512bw"}, "x86_64", "avx512"),
        ({"avx2", "fma", "avx_vnni"}, "AMD64", "avx2"),
        ({"asimd", "asimddp"}, "aarch64", "arm64"),
        ({"sse2", "sse4_2"}, "x86_64", None),
    ],
)
def test_family_is_read_from_the_flags(flags, machine, family):
    found = cpu_family(frozenset(flags), machine)
    assert (found.name if found else None) == family


def test_this_cpus_flags_agree_with_numpys_reading():
    """The kernel's flags (Linux) name every feature numpy finds on this CPU, in the kernel's names."""
    from moe_embed.convert.cpu_graph import NUMPY_FLAGS

    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        from numpy.core._multiarray_umath import __cpu_features__ as features
    found = {NUMPY_FLAGS[name] for name, present in features.items() if present and name in NUMPY_FLAGS}
    assert found <= cpu_flags()
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert "sse2" in cpu_flags() or not Path("/proc/cpuinfo").is_file()


def test_each_family_serves_int8_only_where_measured_faster(mote_onnx, tmp_path):
    assert family_file(mote_onnx, "onnxruntime", FAMILY["avx512_vnni"])[0] == "onnx/model_qint8_avx512_vnni.onnx"
    for name in ("avx512", "avx2", "arm64"):
        file, why = family_file(mote_onnx, "onnxruntime", FAMILY[name])
        assert file == "onnx/model.onnx" and FAMILY[name].evidence in why
    openvino = "openvino/openvino_model_qint8_quantized.xml"
    expected = {"avx512_vnni": openvino, "avx512": openvino, "avx2": "onnx/model.onnx", "arm64": "onnx/model.onnx"}
    if (mote_onnx / openvino).is_file():  # the openvino extra
        assert {f.name: family_file(mote_onnx, "openvino", f)[0] for f in FAMILIES} == expected
    assert family_file(mote_onnx, "onnxruntime", None)[0] == "onnx/model.onnx"
    # the folder's card gives each family the same files
    card = (mote_onnx / "README.md").read_text()
    assert "| avx512_vnni (avx512_vnni, amx_int8) | `onnx/model_qint8_avx512_vnni.onnx` |" in card
    assert "| avx2 (avx2) | `onnx/model.onnx` | `onnx/model.onnx` |" in card
    # a folder exported without --quantize: fp32, saying why
    plain = tmp_path / "plain"
    (plain / "onnx").mkdir(parents=True)
    file, why = family_file(plain, "onnxruntime", FAMILY["avx512_vnni"])
    assert file == "onnx/model.onnx" and "has no onnx/model_qint8_avx512_vnni.onnx" in why
    # a folder written with --int8-variants avx512: the same graph as the VNNI one, served on a VNNI CPU
    only = tmp_path / "only-avx512"
    (only / "onnx").mkdir(parents=True)
    (only / "onnx" / "model_qint8_avx512.onnx").write_bytes(b"")
    assert family_file(only, "onnxruntime", FAMILY["avx512_vnni"])[0] == "onnx/model_qint8_avx512.onnx"
    (only / "onnx" / "model_qint8_avx512.onnx").unlink()
    (only / "onnx" / "model_quint8_avx2.onnx").write_bytes(b"")  # another setting: not a stand-in
    assert family_file(only, "onnxruntime", FAMILY["avx512_vnni"])[0] == "onnx/model.onnx"
    with pytest.raises(ValueError, match="runtime must be"):
        family_file(mote_onnx, "tensorrt", FAMILY["avx2"])


def test_embedder_serves_the_graph_for_this_cpu_and_says_which(mote_onnx, monkeypatch, caplog):
    from moe_embed.convert import cpu_graph as cpu
    from moe_embed.training.embedders import Embedder, graph_file

    texts = ["how do plants make energy?", "stocks fell", "a man plays a guitar on a stage"]
    with caplog.at_level(logging.INFO, logger="moe_embed.training.embedders"):
        chosen = graph_file(mote_onnx, None)
    assert chosen == serving_file(mote_onnx)[0]
    assert f"embedding with {cpu.describe(cpu.cpu_family(), cpu_flags())}: " in caplog.text and chosen in caplog.text
    assert graph_file(mote_onnx, "onnx/model.onnx") == "onnx/model.onnx"  # a named graph wins
    for family, file in (("avx2", "onnx/model.onnx"), ("avx512_vnni", "onnx/model_qint8_avx512_vnni.onnx")):
        monkeypatch.setattr(cpu, "cpu_family", lambda flags=None, machine=None, name=family: FAMILY[name])
        picked = Embedder(str(mote_onnx), "query")(texts, 3)
        named = Embedder(str(mote_onnx), "query", onnx_file=file)(texts, 3)
        assert np.array_equal(picked, named), family


def test_embed_job_keeps_the_graph_it_started_with(mote_onnx, dense_path, monkeypatch, tmp_path):
    """A job resumed on another kind of CPU embeds with the graph it started with; a named graph wins."""
    from moe_embed.convert import cpu_graph as cpu
    from moe_embed.training.embed import JOB_FILE, job_graph

    monkeypatch.setattr(cpu, "cpu_family", lambda flags=None, machine=None: FAMILY["avx512_vnni"])
    assert job_graph(str(mote_onnx), None, tmp_path / "new") == "onnx/model_qint8_avx512_vnni.onnx"
    output = tmp_path / "started"
    output.mkdir()
    (output / JOB_FILE).write_text(json.dumps({"model": str(mote_onnx), "onnx_file": "onnx/model.onnx"}))
    assert job_graph(str(mote_onnx), None, output) == "onnx/model.onnx"
    assert job_graph(str(mote_onnx), "onnx/model_quint8_avx2.onnx", output) == "onnx/model_quint8_avx2.onnx"
    assert job_graph(dense_path, None, output) is None  # a PyTorch folder has no graph to choose


@pytest.mark.slow
@pytest.mark.parametrize("family", ["avx2", "avx512_vnni"])
def test_openvino_int8_export_says_where_it_is_slower_than_fp32(
    family, trained_mote, mote_onnx, monkeypatch, caplog, tmp_path
):
    """On a CPU whose family OpenVINO's int8 does not pay on, the export still writes it and says to serve fp32."""
    import shutil

    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer

    from moe_embed.convert import cpu_graph as cpu
    from moe_embed.convert import openvino_int8
    from moe_embed.convert.onnx_checks import openvino_quantized
    from moe_embed.convert.onnx_graph import embed, session
    from moe_embed.convert.onnx_int8 import Int8Fit

    if not openvino_int8.available():
        pytest.skip("the openvino extra is not installed")
    folder = Path(shutil.copytree(mote_onnx, tmp_path / "onnx-folder"))
    monkeypatch.setattr(cpu, "cpu_family", lambda flags=None, machine=None: FAMILY[family])
    st = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    client = Tokenizer.from_file(str(folder / "tokenizer.json"))
    texts = ["how do plants make energy?", "stocks fell"]
    fp32 = embed(session(folder / "onnx" / "model.onnx"), client, texts)
    fit = Int8Fit(folder / "onnx" / "model.onnx", tmp_path)  # no calibration: the fp32 graph as it is
    with caplog.at_level(logging.WARNING, logger="moe_embed.convert.onnx_checks"):
        agreement = openvino_quantized(folder, fit, client, st, (texts, fp32), 0.9)
    assert agreement["min_cosine"] >= 0.9
    warned = [r.getMessage() for r in caplog.records if "slower than OpenVINO's fp32" in r.getMessage()]
    if family == "avx512_vnni":
        assert warned == []
    else:
        assert len(warned) == 1 and "avx2 CPU" in warned[0] and "serve onnx/model.onnx" in warned[0], warned
