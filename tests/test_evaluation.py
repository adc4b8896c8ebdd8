"""`moe-embed evaluate`: the suite's tasks are mteb's (their types as mteb has them), scored by mteb on the
Hub-layout fixtures; the command's output, its errors, and one check against the real data (skipped where
../shared/data is absent)."""

import json

import pytest
from conftest import FIXTURE_DATA, requires_shared_data

from moe_embed.errors import run_cli
from moe_embed.evaluation.run import TASKS
from moe_embed.evaluation.run import main as run_main
from moe_embed.evaluation.tasks import DEV_SETS, SUITE, get_task


def test_suite_types_and_dev_sets_are_mtebs():
    """The types the command lists without importing mteb are mteb's own, and every task resolves."""
    for name, kind in SUITE.items():
        assert get_task(name).metadata.type == kind, name
    for name, (task, split) in DEV_SETS.items():
        assert get_task(task, split).metadata.eval_splits == [split], name
    amazon = get_task("AmazonCounterfactualClassification")
    assert amazon.hf_subsets == ["en"] and amazon.metadata.eval_splits == ["test"]  # the split the suite reports


def test_catalogue_pins_the_revisions_mteb_names():
    """`moe-embed data download` fetches the revision each mteb task reads (a copy of another revision could
    score differently)."""
    from moe_embed.data import CATALOGUE
    from moe_embed.evaluation.tasks import _custom_tasks

    custom = _custom_tasks()
    for name in TASKS:
        dataset = get_task(name).metadata.dataset
        assert dataset["path"] in CATALOGUE, name
        if name not in custom:  # mteb's own task: the catalogue pins exactly the revision mteb reads
            assert CATALOGUE[dataset["path"]].revision == dataset["revision"], name


def test_cli_writes_results_and_refuses_bad_input(dense_path, tmp_path, capsys):
    out = tmp_path / "results.json"
    tasks = "STSBenchmark,Banking77Classification"
    run_cli(run_main, [dense_path, "--tasks", tasks, "--data-dir", str(FIXTURE_DATA), "--output", str(out)])
    results = json.loads(out.read_text())
    assert list(results) == ["STSBenchmark", "Banking77Classification"]
    sts = results["STSBenchmark"]
    assert (sts["metric"], sts["type"], sts["dataset"], sts["split"]) == (
        "cosine_spearman",
        "STS",
        "mteb/stsbenchmark-sts",
        "test",
    )
    assert 0 <= results["Banking77Classification"]["main_score"] <= 100
    assert "| STSBenchmark | STS | cosine_spearman |" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        run_cli(run_main, [dense_path, "--tasks", "STSBenchmark,NoSuchTask", "--data-dir", str(FIXTURE_DATA)])
    assert exit_.value.code == 2 and "unknown tasks ['NoSuchTask']" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        run_cli(run_main, [dense_path, "--tasks", "SICK-R", "--data-dir", str(FIXTURE_DATA)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "mteb/sickr-sts" in err and "moe-embed data download" in err


def test_a_task_in_another_spelling_gets_a_did_you_mean_before_any_model_loads(tmp_path, capsys):
    """`--tasks stsbenchmark` names the suite's `STSBenchmark` in one line, exit 2; the model (here a folder that
    does not exist) is not looked at."""
    with pytest.raises(SystemExit) as exit_:
        run_cli(run_main, [str(tmp_path / "no-model"), "--tasks", "stsbenchmark,Banking77Clustering,scifac"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "\n" not in err
    assert "'stsbenchmark': did you mean STSBenchmark?" in err and "'scifac': did you mean SciFact?" in err


@pytest.mark.slow
@requires_shared_data
def test_mteb_reproduces_the_documented_minilm_score_on_the_real_data(minilm_path, shared_hub_copies, tmp_path):
    """STS-B test through mteb on the real data equals the score docs/results.md gives for all-MiniLM-L6-v2."""
    out = tmp_path / "results.json"
    run_cli(
        run_main, [minilm_path, "--tasks", "STSBenchmark", "--data-dir", str(shared_hub_copies), "--output", str(out)]
    )
    assert json.loads(out.read_text())["STSBenchmark"]["main_score"] == pytest.approx(82.03, abs=0.01)
