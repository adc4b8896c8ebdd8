"""mteb's own evaluators run on a saved MoTE folder, offline, on the Hub-layout fixtures of tests/data: every
task type the suite uses reaches the expert the MoTE paper maps it to, through the folder's prompts alone (no
wrapper); scores agree with a direct computation; a missing dataset is one line naming the download command."""

import random

import numpy as np
import pytest
from conftest import FIXTURE_DATA, record_experts
from scipy.stats import spearmanr
from sentence_transformers import SentenceTransformer

from moe_embed.errors import UsageError
from moe_embed.evaluation.tasks import get_task, load, run, score

# the suite's task of each kind, and the MoTE tasks whose experts must encode it (retrieval: queries and documents)
ROUTES = {
    "STSBenchmark": {"classification"},
    "SciFact": {"query", "document"},
    "TwitterURLCorpus": {"classification"},
    "Banking77Classification": {"classification"},
    "Banking77Clustering": {"clustering"},
}


@pytest.fixture(scope="module")
def routed_model(trained_mote):
    """The trained MoTE folder (its experts differ) loaded as mteb gets it, recording the experts that run."""
    model = SentenceTransformer(str(trained_mote), trust_remote_code=True)
    return model, record_experts(model)  # each forward pass's `task_ids`


@pytest.mark.parametrize("name", list(ROUTES))
def test_mteb_routes_each_task_type_to_its_expert(routed_model, name):
    model, ran = routed_model
    ran.clear()
    result = run(model, load(get_task(name), FIXTURE_DATA))
    tasks = model[0].auto_model.config.tasks
    experts = {tasks[i] for ids in ran for i in ids.tolist()}
    assert experts == ROUTES[name], f"{name} ran the experts {sorted(experts)}"
    assert 0 <= result.get_score() <= 1


def test_mteb_sts_score_is_the_spearman_of_cosines_through_the_sts_expert(routed_model):
    model, _ = routed_model
    task = load(get_task("STSBenchmark"), FIXTURE_DATA)
    rows = task.dataset["test"]
    a = model.encode(list(rows["sentence1"]), prompt_name="Classification")
    b = model.encode(list(rows["sentence2"]), prompt_name="Classification")
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert score(model, task) == pytest.approx(100 * spearmanr(list(rows["score"]), cosine).statistic, abs=1e-4)


def test_a_dev_split_is_scored_on_that_split(dense_path):
    """stsb-dev: the same mteb task on its validation split (12 rows in the fixture, 8 in test)."""
    task = load(get_task("STSBenchmark", "validation"), FIXTURE_DATA)
    assert len(task.dataset["validation"]) == 12
    assert set(run(SentenceTransformer(dense_path), task).scores) == {"validation"}


def test_offline_without_the_dataset_is_one_line_naming_it_and_the_download(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(UsageError) as error:
        load(get_task("SICK-R"), FIXTURE_DATA)  # the fixture folder has no copy of mteb/sickr-sts
    message = str(error.value)
    assert "\n" not in message and "mteb/sickr-sts" in message and "moe-embed data download DIR" in message


def test_classification_draws_read_from_lists_are_mtebs_own():
    """The loaded task reads its label column once (a lazy `datasets` column costs a table copy per row); the
    draws are exactly those of mteb's own method on the dataset itself."""
    from datasets import Dataset

    task = load(get_task("Banking77Classification"), FIXTURE_DATA)
    rng = random.Random(0)  # labels without a period: a misread label column changes which rows are drawn
    labels = [f"l{rng.randrange(7)}" for _ in range(200)]
    data = Dataset.from_dict({"text": [f"t{i}" for i in range(200)], "label": labels})
    mteb_own = type(task)._undersample_data
    for experiment in range(3):
        ours = task._undersample_data(data, experiment, list(range(200)))
        theirs = mteb_own(task, data, experiment, list(range(200)))
        assert ours[1:] == theirs[1:] and ours[0]["text"] == theirs[0]["text"]
        assert len(ours[2]) == 7 * task.samples_per_label
