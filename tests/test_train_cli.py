"""moe_embed.training.train: the task registry reaches the losses, prompts and batches; bad configs exit 2."""

import json
from pathlib import Path

import pytest
import yaml
from sentence_transformers import SentenceTransformer

from moe_embed.errors import UsageError, run_cli
from moe_embed.training.config import TrainingConfig, describe_options
from moe_embed.training.tasks import TASK_TYPES
from moe_embed.training.train import build_entries, load_config, read_datasets
from moe_embed.training.train import main as train_main


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _write_data(folder):
    _jsonl(
        folder / "ret.jsonl",
        [{"anchor": f"question {i}", "positive": f"answer {i}", "negative": f"other {i}"} for i in range(8)],
    )
    _jsonl(folder / "para.jsonl", [{"anchor": f"text {i}", "positive": f"same text {i}"} for i in range(8)])
    _jsonl(folder / "para2.jsonl", [{"anchor": f"news {i}", "positive": f"story {i}", "source": "x"} for i in range(4)])


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write_data(tmp_path)
    return tmp_path


def _config(workdir, mote_dir, **overrides):
    config = {
        "model": mote_dir,
        "trust_remote_code": True,
        "output_dir": "out",
        "batch_size": 4,
        "max_steps": 2,
        "tasks": {
            "retrieval": [{"name": "ret", "path": "ret.jsonl"}],
            "clustering": [{"name": "a", "path": "para.jsonl"}, {"name": "b", "path": "para2.jsonl"}],
        },
    }
    config.update(overrides)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_registry_reaches_entries_losses_and_prompts(workdir, mote_dir):
    config = load_config(_config(workdir, mote_dir))
    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    datasets, losses, prompts = build_entries(config, read_datasets(config, workdir), model)
    assert set(datasets) == {"retrieval/ret", "clustering"}  # retrieval stays per dataset, clustering is concatenated
    assert len(datasets["clustering"]) == 12 and datasets["clustering"].column_names == ["anchor", "positive"]
    assert (
        losses["retrieval/ret"].scale
        == pytest.approx(1 / TASK_TYPES["retrieval"].temperature)
        == pytest.approx(1 / 0.03)
    )
    assert losses["clustering"].scale == pytest.approx(1 / 0.06)
    assert prompts["retrieval/ret"] == {
        "anchor": "search_query: ",
        "positive": "search_document: ",
        "negative": "search_document: ",
    }
    assert prompts["clustering"] == {"anchor": "clustering: ", "positive": "clustering: "}


def test_static_curriculum_mixes_tasks_with_prompts_in_the_text(workdir, mote_dir):
    config = load_config(_config(workdir, mote_dir, curriculum="static", temperature=0.05))
    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    datasets, losses, prompts = build_entries(config, read_datasets(config, workdir), model)
    assert list(datasets) == ["static"] and prompts == {"static": {}}
    assert losses["static"].scale == pytest.approx(1 / 0.05)
    rows = datasets["static"]
    assert len(rows) == 8 + 12 and rows.column_names == ["anchor", "positive"]  # the columns all entries share
    starts = {(row["anchor"].split(": ")[0], row["positive"].split(": ")[0]) for row in rows}
    assert starts == {("search_query", "search_document"), ("clustering", "clustering")}
    assert {row["anchor"] for row in rows} >= {"search_query: question 3", "clustering: news 2"}
    # the batches mix tasks, and MoTE routes each row by the prefix in its text
    first = rows.select(range(8))["anchor"]
    assert len({text.split(": ")[0] for text in first}) == 2
    from moe_embed.modeling.task_router import TaskRouter

    ids = model.tokenize(first)["input_ids"]
    tasks = model[0].auto_model.config.tasks
    assert [tasks[i] for i in TaskRouter(model[0].auto_model.config).match(ids)[0]] == [
        "query" if text.startswith("search_query") else "clustering" for text in first
    ]


def test_loss_options_build_the_configured_losses(workdir, mote_dir):
    from sentence_transformers.sentence_transformer import losses as st_losses

    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    dims = [model.get_embedding_dimension(), 16]
    options = {"cached_mini_batch_size": 3, "matryoshka_dims": dims, "gather_across_devices": True}
    config = load_config(_config(workdir, mote_dir, loss=options))
    _, losses, _ = build_entries(config, read_datasets(config, workdir), model)
    for entry, loss in losses.items():
        assert isinstance(loss, st_losses.MatryoshkaLoss) and list(loss.matryoshka_dims) == dims
        inner = loss.loss
        assert isinstance(inner, st_losses.CachedMultipleNegativesRankingLoss)
        assert inner.mini_batch_size == 3 and inner.gather_across_devices
        assert inner.scale == pytest.approx(1 / (0.03 if entry.startswith("retrieval") else 0.06))
    config = load_config(_config(workdir, mote_dir))
    _, losses, _ = build_entries(config, read_datasets(config, workdir), model)
    assert all(
        type(loss) is st_losses.MultipleNegativesRankingLoss and not loss.gather_across_devices
        for loss in losses.values()
    )


@pytest.mark.slow
def test_cli_trains_and_saves_with_gradcache_and_matryoshka(workdir, mote_dir):
    hidden = json.loads((Path(mote_dir) / "config.json").read_text())["hidden_size"]
    loss = {"cached_mini_batch_size": 2, "matryoshka_dims": [hidden, 16]}
    train_main(["--config", str(_config(workdir, mote_dir, loss=loss, max_seq_length=16))])
    trained = SentenceTransformer(str(workdir / "out"), trust_remote_code=True)
    assert trained.encode_query(["question 1"]).shape == (1, hidden)
    assert trained.max_seq_length == SentenceTransformer(mote_dir, trust_remote_code=True).max_seq_length
    before = SentenceTransformer(mote_dir, trust_remote_code=True)
    changed = {
        name
        for name, p in trained[0].auto_model.named_parameters()
        if not p.equal(before[0].auto_model.get_parameter(name))
    }
    assert changed and not any(".experts.2." in name for name in changed)  # classification saw no batch


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tasks": {"reranking": [{"path": "ret.jsonl"}]}}, "unknown task type 'reranking'"),
        ({"tasks": {"retrieval": [{"path": "missing.jsonl"}]}}, "missing.jsonl not found"),
        ({"tasks": {"retrieval": [{"path": "bad.jsonl"}]}}, "lacks `anchor` or `positive`"),
        ({"tasks": {"retrieval": [{"file": "ret.jsonl"}]}}, "unknown key 'file' in tasks.retrieval[0]"),
        ({"tasks": {"retrieval": []}}, "task 'retrieval' lists no datasets"),
        ({"model": 3}, "model must be a string, got 3"),
        ({"learning_rat": 1e-4}, "unknown key 'learning_rat' in config; did you mean 'learning_rate'?"),
        ({"batch_size": "32"}, "batch_size must be an integer, got '32'"),
        ({"trust_remote_code": "yes"}, "trust_remote_code must be true or false"),
        ({"curriculum": "random"}, "unknown curriculum 'random'; expected one of task_aware, static"),
        ({"curriculum": "static", "temperature": "hot"}, "temperature must be a number, got 'hot'"),
        ({"curriculum": "static", "temperature": 0}, "temperature must be a positive number, got 0.0"),
        ({"loss": {"matryoshka": [64]}}, "unknown key 'matryoshka' in loss; did you mean 'matryoshka_dims'?"),
        ({"loss": {"matryoshka_dims": [64, "x"]}}, "loss.matryoshka_dims[1] must be an integer, got 'x'"),
        ({"loss": {"cached_mini_batch_size": 0}}, "loss.cached_mini_batch_size must be a positive integer"),
    ],
)
def test_bad_configs_exit_2(workdir, mote_dir, capsys, change, message):
    _jsonl(workdir / "bad.jsonl", [{"anchor": "a", "answer": "b"}])
    with pytest.raises(SystemExit) as exit_:
        run_cli(train_main, ["--config", str(_config(workdir, mote_dir, **change))])
    assert exit_.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_config_file_errors(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "empty.yaml").write_text("")
    with pytest.raises(UsageError, match="config must define `tasks`"):
        load_config(tmp_path / "empty.yaml")  # model may be left out (the bundled MiniLM); tasks may not
    (tmp_path / "list.yaml").write_text("- model\n")
    with pytest.raises(UsageError, match="config must be a mapping"):
        load_config(tmp_path / "list.yaml")


def test_config_values_are_typed_and_yaml_floats_without_a_dot_are_read(workdir, mote_dir):
    config = load_config(_config(workdir, mote_dir, learning_rate="3e-5", epochs=2, loss={"matryoshka_dims": [64]}))
    assert isinstance(config, TrainingConfig)
    assert config.learning_rate == 3e-5 and config.epochs == 2.0 and isinstance(config.epochs, float)
    assert config.loss.matryoshka_dims == [64] and config.loss.cached_mini_batch_size is None
    assert [spec.path for spec in config.tasks["clustering"]] == ["para.jsonl", "para2.jsonl"]


def test_help_lists_every_option_from_the_dataclass(capsys):
    from dataclasses import fields

    from moe_embed.training.config import LossConfig

    with pytest.raises(SystemExit):
        train_main(["--help"])
    out = capsys.readouterr().out
    assert out.count(describe_options()) == 1
    for cls in (TrainingConfig, LossConfig):
        for field in fields(cls):
            assert f"{field.name}: " in out and field.metadata["help"] in out


def test_the_command_line_sets_config_fields_by_their_own_names(workdir, mote_dir, monkeypatch):
    """`--overwrite-output-dir` and `--data-dir` are the config's `overwrite_output_dir` and `data_dir` (generated
    from those fields, so each has one name; the command line wins); `--overwrite` names its replacement."""
    import moe_embed.training.train as train_module

    seen = {}
    monkeypatch.setattr(train_module, "train", lambda config, base: seen.setdefault("config", config))
    path = _config(workdir, mote_dir)
    train_main(["--config", str(path), "--overwrite-output-dir", "--data-dir", "elsewhere"])
    assert seen["config"].overwrite_output_dir is True and seen["config"].data_dir == "elsewhere"
    with pytest.raises(SystemExit):
        train_main(["--config", str(path), "--overwrite"])


def test_batches_are_not_pinned_without_an_accelerator(workdir, mote_dir):
    """Pinning host memory needs an accelerator: without one, torch warns on every loader that it is not used
    (a warning and its source line, `super().__init__(loader)`, in every run's output)."""
    import torch

    from moe_embed.training.train import training_arguments

    config = load_config(_config(workdir, mote_dir))
    args = training_arguments(config, workdir / "out", {})
    assert args.dataloader_pin_memory is torch.cuda.is_available()


DISTRIBUTED_RUN = """
import json, os, sys
from pathlib import Path
from moe_embed.training.train import load_config, train
from moe_embed.training.trainer import TaskAwareTrainer

record = Path(sys.argv[2])

class RecordingTrainer(TaskAwareTrainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        with open(record / f"rank{os.environ['RANK']}.txt", "a") as handle:
            handle.write(f"{self.state.global_step} {inputs.get('dataset_name')}\\n")
        return super().compute_loss(model, inputs, *args, **kwargs)

    def train(self, *args, **kwargs):
        output = super().train(*args, **kwargs)
        if self.is_world_process_zero():  # the logged loss is averaged over the ranks
            (record / "losses.json").write_text(json.dumps([e["loss"] for e in self.state.log_history if "loss" in e]))
        return output

train(load_config(Path(sys.argv[1])), Path.cwd(), trainer_cls=RecordingTrainer)
"""

# No dropout, so that one process and two see the same function; gathered in-batch negatives, so
# that both compute the loss of the same global batch.
EXACT = {
    "config_kwargs": {"hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0},
    "loss": {"gather_across_devices": True},
    "logging_steps": 1,
    "max_steps": 4,
    "learning_rate": 1e-4,
}


def free_port() -> int:
    """A port no process listens on now (a fixed one may be taken on a shared machine)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Each launcher's arguments end with its port option; the test appends a free port.
LAUNCHERS = {
    "torchrun": ["-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port"],
    # accelerate's multi-process launcher is torchrun's; on CPU, moe_embed.training.train picks the gloo backend
    "accelerate": [
        "-m",
        "accelerate.commands.launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
    ],
}


@pytest.fixture(scope="module")
def single_process_losses(tmp_path_factory, mote_dir):
    """Per-step losses of one process on global batches of 4 (the 2-process runs use 2 per rank)."""
    from moe_embed.training.train import train
    from moe_embed.training.trainer import TaskAwareTrainer

    workdir = tmp_path_factory.mktemp("single")
    _write_data(workdir)
    trainers = []

    class Keep(TaskAwareTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trainers.append(self)

    train(
        load_config(_config(workdir, mote_dir, batch_size=4, output_dir="single-out", **EXACT)),
        workdir,
        trainer_cls=Keep,
    )
    return [entry["loss"] for entry in trainers[0].state.log_history if "loss" in entry]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_two_processes_match_one_process_on_the_same_global_batch(workdir, mote_dir, single_process_losses, launcher):
    """2 CPU processes (gloo) under torchrun or accelerate launch: at every step both ranks draw
    from the same entry, and the losses equal one process's on the same global batches."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    config = _config(workdir, mote_dir, batch_size=2, output_dir="ddp-out", **EXACT)
    (workdir / "run.py").write_text(DISTRIBUTED_RUN)
    (workdir / "record").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            *LAUNCHERS[launcher],
            str(free_port()),
            str(workdir / "run.py"),
            str(config),
            str(workdir / "record"),
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [(workdir / "record" / f"rank{r}.txt").read_text().split("\n")[:-1] for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 4
    assert ranks[0] == ranks[1]  # same step numbers, same entry on both ranks
    assert {line.split(" ", 1)[1] for line in ranks[0]} == {"retrieval/ret", "clustering"}
    losses = json.loads((workdir / "record" / "losses.json").read_text())
    assert len(losses) == len(single_process_losses) == 4
    assert losses == pytest.approx(single_process_losses, rel=1e-3)
    assert len(set(losses)) > 1  # the steps differ, so matching them all is not a coincidence
    assert (workdir / "ddp-out" / "model.safetensors").exists()


AVERAGE_GRADIENTS = """
import sys, torch, torch.distributed as dist
from moe_embed.training.trainer import average_gradients

rank = int(sys.argv[1])
dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
both, one, none = (torch.nn.Parameter(torch.zeros(3)) for _ in range(3))
both.grad = torch.full((3,), float(rank + 1))      # 1 on rank 0, 2 on rank 1
if rank == 0:
    one.grad = torch.full((3,), 4.0)              # a gradient on rank 0 only (an expert only it routed to)
average_gradients([both, one, none], 2)
assert torch.equal(both.grad, torch.full((3,), 1.5)), both.grad
assert torch.equal(one.grad, torch.full((3,), 2.0)), one.grad   # the absent one counts as zeros
assert none.grad is None                          # unused everywhere: the optimizer skips it
print("ok", rank)
"""


@pytest.mark.slow
def test_average_gradients_follows_ddps_missing_gradient_rule(tmp_path):
    import os
    import subprocess
    import sys

    from conftest import REPO

    (tmp_path / "avg.py").write_text(AVERAGE_GRADIENTS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    store = str(tmp_path / "store")
    processes = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "avg.py"), str(rank), store],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [process.communicate(timeout=300) for process in processes]
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    assert [out.strip() for out, _ in outputs] == ["ok 0", "ok 1"]
