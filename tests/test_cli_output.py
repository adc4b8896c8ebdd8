"""Quiet, readable output from every script: `--help` states each default once and the description once,
this package's own imports raise no DeprecationWarning, and every converter ends with a line on success."""

import importlib
import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPTS = [
    "convert.upcycle",
    "convert.merge_experts",
    "convert.export_onnx",
    "convert.extract_adapter",
    "convert.push_to_hub",
    "convert.calibrate_aea",
    "training.train",
    "training.data_tools",
    "evaluation.run",
    "evaluation.intertask",
    "evaluation.expert_usage",
    "experiments.prepare_data",
    "experiments.mote_vs_ic",
    "experiments.comoe_vs_lora",
    "experiments.aea_moe_encoder",
    "benchmarks.bench_aea",
    "benchmarks.bench_comoe",
    "benchmarks.bench_compile",
    "benchmarks.bench_serving",
    "benchmarks.ort_kernels",
    "benchmarks.expert_split",
    "benchmarks.session_rate",
    "benchmarks.int8_graphs",
    "benchmarks.bench_train",
]


@pytest.mark.parametrize("module", SCRIPTS)
def test_help_states_each_default_once_and_the_description_once(module, capsys):
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    assert "(default: None)" not in text
    # a default stated in the help and appended again ("(default: 8 / 4) (default: None)"), across line wraps
    assert not re.search(r"\(default[^)]*\)\s*\(default", text), text
    first = (importlib.import_module(module).__doc__ or "").strip().splitlines()[0]
    assert text.count(first) == 1, f"the description's first line appears {text.count(first)} times"


@pytest.mark.slow
def test_own_imports_raise_no_deprecation_warning():
    """sentence-transformers 6 warns on `sentence_transformers.models`; this package imports the new path
    there and the old one only on 5.x."""
    code = (
        "import convert.export_onnx, convert.upcycle, evaluation.run, training.train\n"
        "import modeling.st_mote, modeling.st_moe, modeling.st_aea, modeling.st_compat\n"
        "from convert.onnx_graph import st_head\n"
    )
    result = subprocess.run(
        [sys.executable, "-W", "error::DeprecationWarning", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    # only warnings raised from this repository's files count: a library may deprecate its own internals
    own = [line for line in result.stderr.splitlines() if "DeprecationWarning" in line]
    assert result.returncode == 0, result.stderr[-3000:]
    assert not own, own
