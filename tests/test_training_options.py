"""Training options for specialising without forgetting: upcycling from a dense model in the
config, training only the experts, a separate expert learning rate, regularisers towards the starting
model, the learning-rate schedule and checkpoint selection on dev data."""

import json
from pathlib import Path

import pytest
import torch
from conftest import FIXTURE_DATA, REPO, run_main
from safetensors.torch import load_file

from moe_embed.errors import UsageError
from moe_embed.training.config import TrainingConfig, from_mapping
from moe_embed.training.dev import BestOnDev
from moe_embed.training.train import main as train_main
from moe_embed.training.train import train
from moe_embed.training.trainer import TaskAwareTrainer

pytestmark = pytest.mark.slow


def _pairs(path: Path) -> str:
    rows = [
        {"anchor": f"question {i} about topic {i % 3}", "positive": f"answer {i} on topic {i % 3}"} for i in range(16)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def _config(tmp_path: Path, model: str, **options) -> TrainingConfig:
    data = {
        "model": model,
        "output_dir": str(tmp_path / "out"),
        "max_steps": 2,
        "batch_size": 4,
        "learning_rate": 1e-3,
        "logging_steps": 1,
        "tasks": {"retrieval": [{"name": "pairs", "path": _pairs(tmp_path / "pairs.jsonl")}]},
        **options,
    }
    return from_mapping(TrainingConfig, data)


class RecordingTrainer(TaskAwareTrainer):
    """Keeps itself where the test can read it after `train()`."""

    last = None

    def train(self, *args, **kwargs):
        RecordingTrainer.last = self
        return super().train(*args, **kwargs)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"arch": "bogus"}, "unknown arch 'bogus'; expected one of mote, moe, comoe, lora"),
        ({"trainable": "ffn"}, "unknown trainable 'ffn'; expected one of all, experts"),
        ({"regularizer": {"kind": "ewc"}}, "unknown regularizer.kind 'ewc'; expected one of none, distill, l2"),
        ({"lr_scheduler_type": "cosin"}, "unknown lr_scheduler_type 'cosin'; expected one of linear, cosine"),
        ({"dev": {"tasks": ["stsb-test"]}}, "unknown dev.tasks ['stsb-test']; expected names from stsb-dev"),
        ({"upcycle": {"num_local_experts": 2}}, "`upcycle` options apply to arch mote / moe"),
        ({"warmup_ratio": 0.1, "warmup_steps": 3}, "give warmup_steps or warmup_ratio, not both"),
    ],
)
def test_bad_options_name_the_valid_ones(tmp_path, dense_path, options, message):
    with pytest.raises(UsageError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        _config(tmp_path, dense_path, **options)


def test_unknown_upcycle_option_is_one_line(tmp_path, dense_path, capsys):
    config = tmp_path / "config.yaml"
    data = {
        "model": dense_path,
        "arch": "moe",
        "upcycle": {"num_local_experts": 2, "bogus": 1},
        "output_dir": str(tmp_path / "out"),
        "tasks": {"retrieval": [{"path": _pairs(tmp_path / "pairs.jsonl")}]},
    }
    config.write_text(json.dumps(data))
    code, err = run_main(train_main, "--config", str(config), capsys=capsys)
    assert code == 2 and "unknown key 'bogus' in upcycle" in err.strip().splitlines()[-1]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("prefix_routes_only", [False, True])
def test_mote_from_dense_training_only_experts_leaves_the_rest_bit_identical(tmp_path, dense_path, prefix_routes_only):
    """With the prefix fed or only routing (`task_ids` features), the batches reach their own experts."""
    upcycle = {"expert_layers": "all", "prefix_routes_only": prefix_routes_only}
    config = _config(tmp_path, dense_path, arch="mote", trainable="experts", upcycle=upcycle, seed=1)
    train(config, tmp_path)
    dense = load_file(f"{dense_path}/model.safetensors")
    trained = load_file(str(tmp_path / "out" / "model.safetensors"))
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["model_type"] == "mote_bert" and saved["expert_layers"] == list(range(saved["num_hidden_layers"]))
    assert saved["prefix_routes_only"] is prefix_routes_only
    shared = [key for key in trained if ".experts." not in key]
    assert shared and all(torch.equal(trained[key], dense[key]) for key in shared)
    query = saved["tasks"].index("query")
    classification = saved["tasks"].index("classification")
    part = "intermediate.dense.weight"
    # the query expert trained (retrieval anchors); the classification expert saw no data: still the dense FFN
    assert not torch.equal(trained[f"encoder.layer.0.experts.{query}.{part}"], dense[f"encoder.layer.0.{part}"])
    assert torch.equal(trained[f"encoder.layer.0.experts.{classification}.{part}"], dense[f"encoder.layer.0.{part}"])


def test_moe_expert_learning_rate_groups_and_schedule(tmp_path, dense_path):
    config = _config(
        tmp_path,
        dense_path,
        arch="moe",
        upcycle={"num_local_experts": 2, "norm_topk_prob": True},
        learning_rate=1e-5,
        expert_learning_rate=1e-3,
        lr_scheduler_type="cosine",
        warmup_ratio=0.5,
        regularizer={"kind": "distill", "weight": 1.0},
    )
    train(config, tmp_path, trainer_cls=RecordingTrainer)
    trainer = RecordingTrainer.last
    assert trainer.args.lr_scheduler_type == "cosine" and trainer.args.warmup_steps == 0.5
    transformer = trainer.model[0].auto_model
    experts = {id(p) for name, p in transformer.named_parameters() if ".mlp.experts." in name or ".mlp.router." in name}
    rates = {id(p): group["initial_lr"] for group in trainer.optimizer.param_groups for p in group["params"]}
    assert experts and all(rates[i] == 1e-3 for i in experts)
    assert {rate for i, rate in rates.items() if i not in experts} == {1e-5}
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_local_experts"] == 2


def test_distillation_is_zero_when_the_model_is_its_teacher(dense_path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    from moe_embed.training.regularizers import L2ToStart, regularizer

    model = SentenceTransformer(dense_path, device="cpu").eval()  # no dropout: the student is deterministic
    distill = regularizer("distill", 1.0, model)(MultipleNegativesRankingLoss(model))
    l2 = regularizer("l2", 1.0, model)(MultipleNegativesRankingLoss(model))
    assert isinstance(l2, L2ToStart)
    features = [model.preprocess(["who was isaac newton?", "cats"]), model.preprocess(["a physicist", "pets"])]
    for f in features:
        model(f)  # what the loss does: the embeddings land in the features
    assert distill.penalty(features).abs().item() < 1e-6
    assert l2.penalty().item() == 0.0
    with torch.no_grad():
        model[0].auto_model.encoder.layer[0].output.dense.weight.mul_(1.5)
    for f in features:
        model(f)
    assert distill.penalty(features).item() > 1e-4 and l2.penalty().item() > 0


class _Scripted(BestOnDev):
    """BestOnDev with dev scores given in advance."""

    def __init__(self, model, scores):
        self.model, self.tasks, self.eval_steps, self.history, self.best = model, [], 2, [], None
        self.scores = iter(scores)

    def score(self):
        return {"dev": next(self.scores)}


def test_dev_selection_restores_the_best_step_including_the_start():
    class State:
        global_step, max_steps = 0, 6

    model = torch.nn.Linear(3, 2)
    frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
    model.register_parameter("frozen", frozen)
    callback, state, snapshots = _Scripted(model, [50.0, 80.0, 80.0, 60.0]), State(), {}
    callback.on_train_begin(None, state, None)
    for step in range(1, 7):
        with torch.no_grad():
            model.weight.add_(1.0)
        state.global_step = step
        snapshots[step] = model.weight.detach().clone()
        callback.on_step_end(None, state, None)
    callback.on_train_end(None, state, None)
    assert [h["step"] for h in callback.history] == [0, 2, 4, 6]
    assert callback.selected["selected_step"] == 2  # the first of two equal bests
    assert torch.equal(model.weight, snapshots[2])
    start = _Scripted(torch.nn.Linear(3, 2), [90.0, 10.0])
    weight = start.model.weight.detach().clone()
    state.global_step = 0
    start.on_train_begin(None, state, None)
    with torch.no_grad():
        start.model.weight.add_(1.0)
    state.global_step = 1
    start.on_train_end(None, state, None)
    assert start.selected["selected_step"] == 0 and torch.equal(start.model.weight, weight)


def test_dev_scores_are_written_and_the_selected_step_is_the_best(tmp_path, dense_path):
    config = _config(
        tmp_path,
        dense_path,
        max_steps=3,
        data_dir=str(FIXTURE_DATA),
        dev={"tasks": ["stsb-dev"], "eval_steps": 1},
    )
    train(config, tmp_path)
    scores = json.loads((tmp_path / "out" / "dev_scores.json").read_text())
    assert [h["step"] for h in scores["history"]] == [0, 1, 2, 3]
    best = max(h["dev"] for h in scores["history"])
    assert scores["dev"] == best
    assert next(h["step"] for h in scores["history"] if h["dev"] == best) == scores["selected_step"]


def test_training_reads_hub_datasets_through_the_same_path_as_the_hub(tmp_path, dense_path):
    """`hub:` datasets (a parquet subset, a labelled split) and the dev set, from the Hub-layout fixtures."""
    config = _config(
        tmp_path,
        dense_path,
        data_dir=str(FIXTURE_DATA),
        tasks={
            "retrieval": [{"hub": "sentence-transformers/all-nli", "subset": "triplet"}],
            "classification": [{"hub": "mteb/banking77", "format": "labelled", "max_rows": 6}],
        },
        dev={"tasks": ["stsb-dev"], "eval_steps": 1},
    )
    train(config, tmp_path, trainer_cls=RecordingTrainer)
    datasets = RecordingTrainer.last.train_dataset
    by_rows = {len(data): data for data in datasets.values()}  # the entries' names are the curriculum's business
    assert sorted(by_rows) == [6, 8] and by_rows[8].column_names == ["anchor", "positive", "negative"]
    assert len(json.loads((tmp_path / "out" / "dev_scores.json").read_text())["history"]) == 3


def test_the_public_data_recipe_reads_its_hub_datasets_and_names_the_first_it_cannot_reach(capsys):
    """examples/train_mote_hub.yaml offline with only the fixtures: SciFact is read from its copy; the next
    dataset, out of reach, stops the run in one line before any model is loaded."""
    recipe = REPO / "examples" / "train_mote_hub.yaml"
    code, err = run_main(train_main, "--config", str(recipe), "--data-dir", str(FIXTURE_DATA), capsys=capsys)
    last = err.strip().splitlines()[-1]
    assert code == 2 and "sentence-transformers/natural-questions" in last and "moe-embed data download" in last
