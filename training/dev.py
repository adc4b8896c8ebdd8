"""Checkpoint selection on development data that is not a test split.

`BestOnDev` scores the model on the `dev:` sets before training (step 0: the model it started from is a
candidate too) and every `eval_steps` steps, keeps the weights that train of the best-scoring step in
memory, puts them back when training ends and writes the history to `dev_scores.json` in the output
folder. A dev set is a suite task on a split the suite does not report (`moe_embed.evaluation.tasks.DEV_SETS`), scored
by mteb as the suite scores it: a run selected this way has seen no test data.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import torch
from transformers import TrainerCallback

from moe_embed.data import data_dir as find_data_dir
from moe_embed.errors import UsageError
from moe_embed.evaluation.tasks import DEV_SETS, get_task, load, score

logger = logging.getLogger(__name__)


def load_dev_sets(names: list[str], data_dir: str | None = None) -> dict:
    """The dev sets `names` as mteb tasks with their data read (the data folder's copies, else the Hub)."""
    unknown = [name for name in names if name not in DEV_SETS]
    if unknown or not names:
        raise UsageError(f"unknown dev sets {unknown or names}; expected names from {', '.join(DEV_SETS)}")
    folder = find_data_dir(data_dir)
    return {name: load(get_task(*DEV_SETS[name]), folder, purpose=f"dev set {name}") for name in names}


class BestOnDev(TrainerCallback):
    """Score the model on dev sets at step 0 and every `eval_steps` steps; end training with the best weights.

    Only parameters that train are kept (frozen ones cannot differ between steps), so an experts-only run
    holds a copy of its experts, not of the whole model.
    """

    def __init__(self, model, dev_sets: dict, eval_steps: int):
        """`dev_sets`: dev set name -> its loaded task (`load_dev_sets`)."""
        self.model, self.tasks = model, dev_sets
        self.eval_steps = eval_steps
        self.history: list[dict] = []
        self.best: tuple[float, int, dict] | None = None

    def score(self) -> dict[str, float]:
        """Each dev set's score and their mean (`dev`), with the model in eval mode."""
        training = self.model.training
        self.model.eval()
        try:
            scores = {name: score(self.model, task) for name, task in self.tasks.items()}
        finally:
            self.model.train(training)
        return {**scores, "dev": statistics.mean(scores.values())}

    def record(self, step: int) -> None:
        scores = self.score()
        self.history.append({"step": step, **{k: round(v, 4) for k, v in scores.items()}})
        logger.info("dev at step %d: %s", step, ", ".join(f"{k} {v:.2f}" for k, v in scores.items()))
        if self.best is None or scores["dev"] > self.best[0]:  # a tie keeps the earlier step
            kept = {n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters() if p.requires_grad}
            self.best = (scores["dev"], step, kept)

    def on_train_begin(self, args, state, control, **kwargs):
        self.record(0)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.eval_steps == 0 and state.global_step < state.max_steps:
            self.record(state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if not self.history or self.history[-1]["step"] != state.global_step:
            self.record(state.global_step)
        score, step, kept = self.best
        parameters = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, value in kept.items():
                parameters[name].copy_(value)
        logger.info("selected step %d (dev %.2f) of %d", step, score, state.global_step)
        self.selected = {"selected_step": step, "dev": round(score, 4), "history": self.history}


def write_history(callback: BestOnDev, folder: Path) -> None:
    """`dev_scores.json`: every scored step and the one selected."""
    (Path(folder) / "dev_scores.json").write_text(json.dumps(callback.selected, indent=2) + "\n")


__all__ = ["BestOnDev", "load_dev_sets", "write_history"]
