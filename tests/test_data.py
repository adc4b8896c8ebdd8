"""`moe-embed data`: the catalogue of Hub datasets (what docs/data.md lists), `download` into a data folder that
`--data-dir` / $MOE_EMBED_DATA then serve with no network, and the data folder's errors. The Hub's download is
replaced by a copy of the fixtures (the tests have no network); what is asked of it is checked."""

import shutil
from fnmatch import fnmatch
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, REPO, run_main

from moe_embed import data as D
from moe_embed.errors import UsageError


@pytest.fixture
def fake_hub(monkeypatch):
    """`snapshot_download` from the fixture copies: records each call; leaves huggingface_hub's `.cache`."""
    import inspect

    import huggingface_hub
    from huggingface_hub.errors import LocalEntryNotFoundError

    calls = []
    real = inspect.signature(huggingface_hub.snapshot_download)

    def snapshot_download(repo_id, *, repo_type, revision, allow_patterns, local_dir, **kwargs):
        real.bind(repo_id, repo_type=repo_type, revision=revision, allow_patterns=allow_patterns,
                  local_dir=local_dir, **kwargs)  # fmt: skip  # the real function takes these arguments
        calls.append({"repo": repo_id, "type": repo_type, "revision": revision, "patterns": allow_patterns})
        source = FIXTURE_DATA / repo_id
        if not source.is_dir():
            raise LocalEntryNotFoundError("offline")
        for path in source.rglob("*"):  # the files allow_patterns selects, as the Hub sends them
            relative = path.relative_to(source).as_posix()
            if path.is_file() and (allow_patterns is None or any(fnmatch(relative, p) for p in allow_patterns)):
                (Path(local_dir) / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, Path(local_dir) / relative)
        (Path(local_dir) / ".cache" / "huggingface").mkdir(parents=True)
        return str(local_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_download_writes_copies_that_serve_the_same_reads_as_the_hub(fake_hub, tmp_path, capsys):
    target = tmp_path / "data"
    code, err = run_main(D.main, "download", str(target), "--datasets", "mteb/scifact,sentence-transformers/all-nli",
                         capsys=capsys)  # fmt: skip
    assert code == 0, err
    assert [(c["repo"], c["type"], c["revision"]) for c in fake_hub] == [
        ("mteb/scifact", "dataset", D.CATALOGUE["mteb/scifact"].revision),
        ("sentence-transformers/all-nli", "dataset", None),
    ]
    assert fake_hub[1]["patterns"] == ["README.md", "triplet/*"]  # only the subset the recipes read
    assert (
        not (target / "mteb/scifact/.cache").exists() and not (target / "sentence-transformers/all-nli/pair").exists()
    )
    # the partial copy loads: its card no longer names the subset left behind (datasets would resolve it first)
    triplets = D.load("sentence-transformers/all-nli", "triplet", "train", folder=D.data_dir(str(target)))
    assert triplets.column_names == ["anchor", "positive", "negative"] and len(triplets) == 8
    queries = D.load("mteb/scifact", "queries", "queries", folder=D.data_dir(str(target)))
    assert len(queries) == len((FIXTURE_DATA / "mteb/scifact/queries/queries.jsonl").read_text().splitlines())
    # a copy already there is kept; --overwrite fetches it again
    fake_hub.clear()
    assert run_main(D.main, "download", str(target), "--datasets", "mteb/scifact", capsys=capsys)[0] == 0
    assert fake_hub == []
    assert run_main(D.main, "download", str(target), "--datasets", "mteb/scifact", "--overwrite", capsys=capsys)[0] == 0
    assert [c["repo"] for c in fake_hub] == ["mteb/scifact"]


def test_a_failed_download_is_one_line_and_leaves_no_partial_copy(fake_hub, tmp_path, capsys):
    code, err = run_main(D.main, "download", str(tmp_path / "data"), "--datasets", "mteb/sickr-sts", capsys=capsys)
    assert code == 2 and "cannot download mteb/sickr-sts" in err and "Traceback" not in err
    assert not (tmp_path / "data" / "mteb" / "sickr-sts").exists()
    code, err = run_main(D.main, "download", str(tmp_path / "data"), "--datasets", "scifact", capsys=capsys)
    assert code == 2 and "Hub ids like mteb/scifact" in err


def test_the_data_folder_comes_from_the_option_else_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(D.DATA_ENV, raising=False)
    assert D.data_dir(None) is None  # the Hub and its cache
    monkeypatch.setenv(D.DATA_ENV, str(FIXTURE_DATA))
    assert D.data_dir(None) == FIXTURE_DATA
    assert D.local_copy("mteb/scifact", D.data_dir(None)) == FIXTURE_DATA / "mteb/scifact"
    with pytest.raises(UsageError, match="--data-dir.*not found"):
        D.data_dir(str(tmp_path / "typo"))  # a folder named but missing is an error, not "use the Hub"


def test_list_and_docs_name_every_dataset_with_its_use_and_licence(capsys):
    code, _ = run_main(D.main, "list", capsys=capsys)
    docs = (REPO / "docs" / "data.md").read_text()
    assert code == 0
    for entry in D.CATALOGUE.values():
        assert f"`{entry.repo}`" in docs and entry.licence in docs, entry.repo
