"""Every example runs offline against an upcycled model and prints what it promises."""

import pytest
from conftest import read_json, run_repo_script


def run_example(name: str, *args: str, capsys) -> str:
    return run_repo_script(f"examples/{name}", *args, capsys=capsys)


def test_quickstart(mote_dir, capsys):
    out = run_example("quickstart.py", mote_dir, capsys=capsys)
    assert "routed the prefixed rows to experts: ['query', 'document', 'classification', 'clustering']" in out
    assert "inter-task cosine similarity" in out
    agree = float(out.split("agree to ")[1].split()[0])
    assert agree < 1e-5


def test_route_with_automodel(mote_dir, capsys):
    out = run_example("route_with_automodel.py", mote_dir, capsys=capsys)
    assert "routed by prefix: ['query', 'clustering']" in out
    assert "task=['query', 'passage']: ['query', 'document']" in out
    assert "no task: default task 'classification': ['classification', 'classification']" in out


@pytest.mark.slow
def test_semantic_search(minilm_mote_dir, capsys):
    """The search itself: MiniLM finds the right passage (the tiny model is no search engine)."""
    out = run_example("semantic_search.py", minilm_mote_dir, capsys=capsys)
    assert "'who discovered gravity?'        -> 'Isaac Newton" in out
    assert "'how do plants make energy?'     -> 'Photosynthesis" in out


def test_finetune_two_tasks(mote_dir, tmp_path, capsys):
    out = run_example(
        "finetune_two_tasks.py", mote_dir, "--output", str(tmp_path / "ft"), "--steps", "2", capsys=capsys
    )
    assert f"reloaded; query embedding shape: (1, {read_json(f'{mote_dir}/config.json')['hidden_size']})" in out
    assert (tmp_path / "ft" / "st_mote.py").exists()
