"""convert/push_to_hub.py against a stand-in Hub server on 127.0.0.1."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import REPO
from hub_server import FakeHub

pytestmark = pytest.mark.slow  # every test here trains or runs a Hub upload in fresh processes

TOKEN = "hf_secretTestToken0123456789"


@pytest.fixture(scope="module")
def tiny_mote_dir(tmp_path_factory, dense_path):
    """The tiny model, copied beside its MoTE upcycling (the adapter test names it as a local base)."""
    from moe_embed.convert.upcycle import main as upcycle

    root = tmp_path_factory.mktemp("push")
    source = root / "tiny-bert"
    shutil.copytree(dense_path, source)
    upcycle(["--base", str(source), "--output", str(root / "tiny-mote")])
    return root / "tiny-mote"


def push(folder, hub, *args):
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_TOKEN=TOKEN, HF_HUB_DISABLE_TELEMETRY="1")
    env.update(NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")  # the stand-in Hub is local
    return subprocess.run(
        [sys.executable, str(REPO / "convert" / "push_to_hub.py"), str(folder), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _folder_files(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def test_push_uploads_exactly_the_folder(tiny_mote_dir, tmp_path):
    folder = tmp_path / "tiny-mote"
    shutil.copytree(tiny_mote_dir, folder)
    (folder / "pytorch_model.bin").write_bytes(b"not a real pickle")
    before = {p: (folder / p).read_bytes() for p in _folder_files(folder)}
    with FakeHub() as hub:
        result = push(folder, hub, "--repo-id", "alice/tiny-mote", "--private", "--commit-message", "first upload")
    assert result.returncode == 0, result.stderr[-2000:]
    uploaded = hub.state.files["alice/tiny-mote"]
    assert set(uploaded) == _folder_files(folder) - {"pytorch_model.bin"}
    assert {"modeling_mote.py", "st_mote.py"} <= set(uploaded)
    assert not [p for p in uploaded if p.endswith((".bin", ".pt", ".pkl"))]
    assert uploaded["model.safetensors"] == before["model.safetensors"]  # went through LFS intact
    assert hub.state.repos["alice/tiny-mote"]["private"] is True
    assert [c["summary"] for c in hub.state.commits] == ["first upload"]
    front_matter = uploaded["README.md"].decode().split("---")[1]
    metadata = yaml.safe_load(front_matter)
    assert hub.state.validated_cards == [metadata]  # the server parsed the same metadata
    assert metadata["pipeline_tag"] == "sentence-similarity" and "mixture-of-experts" in metadata["tags"]
    assert metadata["library_name"] == "sentence-transformers"
    assert 'SentenceTransformer("alice/tiny-mote", trust_remote_code=True)' in uploaded["README.md"].decode()
    # the token was sent to the server, never written out
    assert any(TOKEN in header for header in hub.state.authorizations)
    assert TOKEN not in result.stdout + result.stderr
    assert "not uploading pytorch_model.bin" in result.stderr
    # the folder itself was not touched
    assert {p: (folder / p).read_bytes() for p in _folder_files(folder)} == before


def test_push_renders_a_card_when_missing_and_uses_a_branch(tiny_mote_dir, tmp_path):
    folder = tmp_path / "no-card"
    shutil.copytree(tiny_mote_dir, folder)
    (folder / "README.md").unlink()
    with FakeHub() as hub:
        result = push(folder, hub, "--repo-id", "bob/no-card", "--revision", "v1")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "v1" in hub.state.repos["bob/no-card"]["branches"] and hub.state.commits[0]["revision"] == "v1"
    card = hub.state.files["bob/no-card"]["README.md"].decode()
    assert card.startswith("---\n") and "bob/no-card" in card and "Mixture of Task Experts" in card


def test_folder_failing_validation_is_not_uploaded(tiny_mote_dir, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_mote_dir, folder)
    with open(folder / "modeling_mote.py", "a") as handle:
        handle.write("\nthis is not python\n")
    with FakeHub() as hub:
        result = push(folder, hub, "--repo-id", "carol/broken")
    assert result.returncode == 2
    assert "failed validation" in result.stderr.strip().splitlines()[-1] and "Traceback" not in result.stderr
    assert hub.state.requests == [] and hub.state.files == {}
    assert TOKEN not in result.stdout + result.stderr


def test_bad_repo_id_and_missing_weights(tiny_mote_dir, tmp_path, capsys):
    from moe_embed.convert.push_to_hub import main
    from moe_embed.errors import run_cli

    def run(*args):
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, list(args))
        return exit_.value.code, capsys.readouterr().err.strip().splitlines()[-1]

    folder = tmp_path / "no-weights"
    shutil.copytree(tiny_mote_dir, folder)
    (folder / "model.safetensors").unlink()
    assert run(str(tiny_mote_dir), "--repo-id", "no-owner") == (
        2,
        "error: --repo-id must look like OWNER/NAME, got 'no-owner'",
    )
    code, message = run(str(folder), "--repo-id", "dave/x")
    assert code == 2 and message.endswith("has no model.safetensors (or model.safetensors.index.json)")


def test_adapter_folder_is_published_naming_a_hub_base(tiny_mote_dir, tmp_path):
    import json

    from moe_embed.convert.extract_adapter import main as extract
    from moe_embed.convert.upcycle import main as upcycle

    source = tiny_mote_dir.parent / "tiny-bert"
    upcycle(["--arch", "comoe", "--base", str(source), "--lora-rank", "4", "--output", str(tmp_path / "comoe")])
    adapter = extract([str(tmp_path / "comoe"), "--output", str(tmp_path / "adapter")])
    with FakeHub() as hub:
        refused = push(adapter, hub, "--repo-id", "alice/tiny-comoe")
        assert refused.returncode == 2 and "pass --base-model-id" in refused.stderr.strip().splitlines()[-1]
        assert "alice/tiny-comoe" not in hub.state.files
        result = push(adapter, hub, "--repo-id", "alice/tiny-comoe", "--base-model-id", "alice/tiny-bert")
    assert result.returncode == 0, result.stderr[-2000:]
    uploaded = hub.state.files["alice/tiny-comoe"]
    assert "model.safetensors" not in uploaded and "adapter_model.safetensors" in uploaded
    for name in ("adapter_config.json", "config.json"):
        assert json.loads(uploaded[name])["base_model_name_or_path"] == "alice/tiny-bert"
    # the folder itself is untouched: it still names the local base, relative to the adapter folder
    named = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert not Path(named).is_absolute() and (adapter / named).resolve() == source.resolve()


def test_push_puts_the_evaluation_scores_in_the_cards_model_index(tiny_mote_dir, tmp_path):
    """`moe-embed evaluate --output` scores become the card's model-index, as mteb's own cards write them."""
    import json

    from conftest import FIXTURE_DATA
    from huggingface_hub import ModelCard

    from moe_embed.evaluation.run import main as evaluate

    scores = tmp_path / "results.json"
    tasks = "STSBenchmark,SciFact"
    evaluate(
        [
            str(tiny_mote_dir),
            "--trust-remote-code",
            "--tasks",
            tasks,
            "--data-dir",
            str(FIXTURE_DATA),
            "--output",
            str(scores),
        ]
    )
    results = json.loads(scores.read_text())
    with FakeHub() as hub:
        result = push(tiny_mote_dir, hub, "--repo-id", "carol/tiny-mote", "--results", str(scores))
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"STSBenchmark": {"main_score": 80.0}}))
        refused = push(tiny_mote_dir, hub, "--repo-id", "carol/other", "--results", str(bad))
    assert result.returncode == 0, result.stderr[-2000:]
    card = ModelCard(hub.state.files["carol/tiny-mote"]["README.md"].decode())
    found = {r.dataset_name: r for r in card.data.eval_results}
    assert set(found) == {"STSBenchmark (default)", "SciFact (default)"}
    sts = found["STSBenchmark (default)"]
    assert (sts.task_type, sts.dataset_type, sts.dataset_split, sts.metric_type, sts.source_name) == (
        "sentence-similarity", "mteb/stsbenchmark-sts", "test", "cosine_spearman", "MTEB",
    )  # fmt: skip
    assert sts.metric_value == pytest.approx(results["STSBenchmark"]["main_score"] / 100, abs=1e-6)
    assert found["SciFact (default)"].task_type == "text-retrieval" and card.data.model_name == "tiny-mote"
    assert refused.returncode == 2 and "lacks" in refused.stderr and "carol/other" not in hub.state.files
