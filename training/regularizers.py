"""Losses that keep a model close to where it started, so that specialising it does not forget.

Both wrap a sentence-transformers loss and add `weight × penalty`:

- `DistillFromStart`: embedding distillation on the batch's own texts. A frozen copy of the starting
  model (the teacher) embeds every column the loss embedded, with the same prompts and routing; the
  penalty is the mean of `1 - cos(student, teacher)` over all texts. It is zero when the model still
  computes what it started with (an upcycled MoTE computes the dense model's function, so this keeps
  every expert close to the dense model on the data it sees).
- `L2ToStart`: the squared distance of the trainable parameters to their starting values, summed
  (L2-SP, Li et al. 2018, "Explicit inductive bias for transfer learning with convolutional networks").

The wrapped loss embeds the features dicts it is given (as `WithAuxLoss` requires too); losses that
embed copies (`CachedMultipleNegativesRankingLoss`) cannot be distilled this way and are refused.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from sentence_transformers.base.losses.merged_forward import column_merging_disabled
from torch import nn

from moe_embed.training.config import REGULARIZERS


class DistillFromStart(nn.Module):
    """`loss + weight · mean(1 - cos(student, frozen starting model))` over the texts of the batch."""

    def __init__(self, loss: nn.Module, weight: float, teacher: nn.Module | None = None):
        super().__init__()
        self.loss, self.model, self.weight = loss, loss.model, weight
        # the teacher is not a submodule: it must not be trained, saved or moved by the trainer
        teacher = teacher if teacher is not None else copy.deepcopy(loss.model)
        self.__dict__["teacher"] = teacher.eval().requires_grad_(False)

    def penalty(self, sentence_features: list[dict]) -> torch.Tensor:
        """Mean `1 - cos` between the embeddings the loss computed and the teacher's of the same inputs."""
        students = [features.get("sentence_embedding") for features in sentence_features]
        if any(student is None for student in students):
            raise ValueError(
                f"DistillFromStart needs the embeddings in the features the loss was given; "
                f"{type(self.loss).__name__} embeds copies (cached losses are not supported)"
            )
        self.teacher.to(students[0].device)
        outputs = {"sentence_embedding", "token_embeddings", "aux_loss"}
        with torch.no_grad():
            teachers = [
                self.teacher({k: v for k, v in features.items() if k not in outputs})["sentence_embedding"]
                for features in sentence_features
            ]
        cosines = [F.cosine_similarity(s, t.to(s.dtype), dim=-1) for s, t in zip(students, teachers, strict=True)]
        return (1 - torch.cat(cosines)).mean()

    def forward(self, sentence_features: list[dict], labels: torch.Tensor | None = None) -> torch.Tensor:
        with column_merging_disabled():  # the loss embeds the dicts we hold, so we see its embeddings
            value = self.loss(sentence_features, labels)
        return value + self.weight * self.penalty(sentence_features)


class L2ToStart(nn.Module):
    """`loss + weight · Σ ||θ - θ_start||²` over the parameters that train."""

    def __init__(self, loss: nn.Module, weight: float, start: dict[str, torch.Tensor] | None = None):
        super().__init__()
        self.loss, self.model, self.weight = loss, loss.model, weight
        self.__dict__["start"] = start if start is not None else starting_values(loss.model)

    def penalty(self) -> torch.Tensor:
        named = dict(self.model.named_parameters())
        terms = [(named[name] - start.to(named[name].device)).pow(2).sum() for name, start in self.start.items()]
        return torch.stack(terms).sum() if terms else torch.zeros(())

    def forward(self, sentence_features: list[dict], labels: torch.Tensor | None = None) -> torch.Tensor:
        return self.loss(sentence_features, labels) + self.weight * self.penalty()


def starting_values(model: nn.Module) -> dict[str, torch.Tensor]:
    """Copies of the parameters that train, by name."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def regularizer(kind: str, weight: float, model: nn.Module):
    """A function that wraps a loss in the regulariser `kind` (one of `REGULARIZERS`) at `weight`, anchored
    at `model` as it is now (after freezing): the teacher or the starting values are taken once and shared
    by every loss of a run."""
    if kind not in REGULARIZERS:
        raise ValueError(f"unknown regularizer {kind!r}; expected one of {', '.join(REGULARIZERS)}")
    if kind == "none" or weight == 0:
        return lambda loss: loss
    if kind == "distill":
        teacher = copy.deepcopy(model).eval().requires_grad_(False)
        return lambda loss: DistillFromStart(loss, weight, teacher)
    start = starting_values(model)
    return lambda loss: L2ToStart(loss, weight, start)


__all__ = ["REGULARIZERS", "DistillFromStart", "L2ToStart", "regularizer", "starting_values"]
