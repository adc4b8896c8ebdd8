"""training.train: the task registry reaches the losses, prompts and batches; bad configs exit 2."""

import json

import pytest
import yaml
from sentence_transformers import SentenceTransformer

from training.tasks import TASK_TYPES
from training.train import ConfigError, build_entries, load_config
from training.train import main as train_main


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _jsonl(tmp_path / "ret.jsonl", [{"anchor": f"question {i}", "positive": f"answer {i}", "negative": f"other {i}"} for i in range(8)])
    _jsonl(tmp_path / "para.jsonl", [{"anchor": f"text {i}", "positive": f"same text {i}"} for i in range(8)])
    _jsonl(tmp_path / "para2.jsonl", [{"anchor": f"news {i}", "positive": f"story {i}", "source": "x"} for i in range(4)])
    return tmp_path


def _config(workdir, mote_dir, **overrides):
    config = {"model": mote_dir, "trust_remote_code": True, "output_dir": "out", "batch_size": 4, "max_steps": 2,
              "tasks": {"retrieval": [{"name": "ret", "path": "ret.jsonl"}],
                        "clustering": [{"name": "a", "path": "para.jsonl"}, {"name": "b", "path": "para2.jsonl"}]}}  # fmt: skip
    config.update(overrides)
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_registry_reaches_entries_losses_and_prompts(workdir, mote_dir):
    config = load_config(_config(workdir, mote_dir))
    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    datasets, losses, prompts = build_entries(config, workdir, model)
    assert set(datasets) == {"retrieval/ret", "clustering"}  # retrieval stays per dataset, clustering is concatenated
    assert len(datasets["clustering"]) == 12 and datasets["clustering"].column_names == ["anchor", "positive"]
    assert losses["retrieval/ret"].scale == pytest.approx(1 / TASK_TYPES["retrieval"].temperature) == pytest.approx(1 / 0.03)
    assert losses["clustering"].scale == pytest.approx(1 / 0.06)
    assert prompts["retrieval/ret"] == {"anchor": "search_query: ", "positive": "search_document: ", "negative": "search_document: "}
    assert prompts["clustering"] == {"anchor": "clustering: ", "positive": "clustering: "}


def test_cli_trains_and_saves(workdir, mote_dir):
    train_main(["--config", str(_config(workdir, mote_dir))])
    trained = SentenceTransformer(str(workdir / "out"), trust_remote_code=True)
    assert trained.encode_query(["question 1"]).shape == (1, 384)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tasks": {"reranking": [{"path": "ret.jsonl"}]}}, "unknown task type 'reranking'"),
        ({"tasks": {"retrieval": [{"path": "missing.jsonl"}]}}, "missing.jsonl not found"),
        ({"tasks": {"retrieval": [{"path": "bad.jsonl"}]}}, "lacks `anchor` or `positive`"),
        ({"model": None}, "must define `model` and `tasks`"),
    ],
)
def test_bad_configs_exit_2(workdir, mote_dir, capsys, change, message):
    _jsonl(workdir / "bad.jsonl", [{"anchor": "a", "answer": "b"}])
    with pytest.raises(SystemExit) as exit_:
        train_main(["--config", str(_config(workdir, mote_dir, **change))])
    assert exit_.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.yaml")


DISTRIBUTED_RUN = """
import os, sys
from pathlib import Path
from sentence_transformers import SentenceTransformerTrainer
from training.train import load_config, train

record = Path(sys.argv[2])

class RecordingTrainer(SentenceTransformerTrainer):
    def compute_loss(self, model, inputs, *args, **kwargs):
        with open(record / f"rank{os.environ['RANK']}.txt", "a") as handle:
            handle.write(f"{self.state.global_step} {inputs.get('dataset_name')}\\n")
        return super().compute_loss(model, inputs, *args, **kwargs)

train(load_config(Path(sys.argv[1])), Path.cwd(), trainer_cls=RecordingTrainer)
"""


def test_two_processes_train_on_the_same_entry_at_every_step(workdir, mote_dir):
    """torchrun with 2 CPU processes (gloo): at every step both ranks draw from the same entry."""
    import os
    import subprocess
    import sys

    from conftest import REPO

    config = _config(workdir, mote_dir, batch_size=2, max_steps=4, output_dir="ddp-out")
    (workdir / "run.py").write_text(DISTRIBUTED_RUN)
    (workdir / "record").mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
         str(workdir / "run.py"), str(config), str(workdir / "record")],
        cwd=workdir, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [(workdir / "record" / f"rank{r}.txt").read_text().split("\n")[:-1] for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 4
    assert ranks[0] == ranks[1]  # same step numbers, same entry on both ranks
    assert {line.split(" ", 1)[1] for line in ranks[0]} == {"retrieval/ret", "clustering"}
    assert (workdir / "ddp-out" / "model.safetensors").exists()
