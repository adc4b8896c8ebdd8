"""The TA-CL task registry (MoTE paper section 3.2 and appendix D.2).

A task type fixes how its batches are built and scored: retrieval datasets stay separate entries
(homogeneous batches, one dataset per batch), classification and clustering datasets are
concatenated into one entry per task (heterogeneous batches); the contrastive temperature is 0.03
for retrieval and classification and 0.06 for clustering. Prompts name the model's prompts per
column: for retrieval the anchor is a query and the other columns are documents.
"""

from __future__ import annotations

from dataclasses import dataclass

from moe_embed.modeling.defaults import TASK_TYPE_EXPERTS, prompt_key


@dataclass(frozen=True)
class TaskType:
    """How batches of one task type are built and scored."""

    batching: str  # "homogeneous" (one entry per dataset) or "heterogeneous" (datasets concatenated)
    temperature: float  # τ of the InfoNCE loss; MultipleNegativesRankingLoss(scale=1/τ)
    column_prompts: dict[str, str]  # column -> prompt name; "*" for the other columns


# The column prompts name the MoTE task of each role (`TASK_TYPE_EXPERTS`, the one task-type table).
TASK_TYPES = {
    "retrieval": TaskType(
        "homogeneous",
        0.03,
        {"anchor": TASK_TYPE_EXPERTS["retrieval_query"], "*": TASK_TYPE_EXPERTS["retrieval_document"]},
    ),
    "classification": TaskType("heterogeneous", 0.03, {"*": TASK_TYPE_EXPERTS["classification"]}),
    "clustering": TaskType("heterogeneous", 0.06, {"*": TASK_TYPE_EXPERTS["clustering"]}),
}


def task_type(name: str) -> TaskType:
    """The registered task type `name`; a ValueError lists the valid ones."""
    if name not in TASK_TYPES:
        raise ValueError(f"unknown task type {name!r}; expected one of {', '.join(TASK_TYPES)}")
    return TASK_TYPES[name]


def column_prompts(kind: TaskType, columns: list[str], prompts: dict[str, str]) -> dict[str, str]:
    """Prompt text per column, from the model's prompts (columns whose prompt the model lacks get none)."""
    result = {}
    for column in columns:
        name = prompt_key(kind.column_prompts.get(column, kind.column_prompts["*"]))
        if name in prompts:
            result[column] = prompts[name]
    return result
