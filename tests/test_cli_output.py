"""Quiet, readable output from every script: `--help` states each default once and the description once,
this package's own imports raise no DeprecationWarning, and every converter ends with a line on success."""

import importlib
import re
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPTS = [
    "moe_embed.convert.upcycle",
    "moe_embed.convert.merge_experts",
    "moe_embed.convert.export_onnx",
    "moe_embed.convert.extract_adapter",
    "moe_embed.convert.push_to_hub",
    "moe_embed.convert.calibrate_aea",
    "moe_embed.training.train",
    "moe_embed.training.data_tools",
    "moe_embed.evaluation.run",
    "moe_embed.evaluation.intertask",
    "moe_embed.evaluation.expert_usage",
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
    "benchmarks.int8_same_check",
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
        "import moe_embed.convert.export_onnx, moe_embed.convert.upcycle\n"
        "import moe_embed.evaluation.run, moe_embed.training.train\n"
        "import moe_embed.modeling.st_mote, moe_embed.modeling.st_moe\n"
        "import moe_embed.modeling.st_aea, moe_embed.modeling.st_compat\n"
        "from moe_embed.convert.onnx_graph import st_head\n"
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
