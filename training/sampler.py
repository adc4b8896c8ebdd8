"""Task-aware multi-dataset batch sampling for data-parallel training (TA-CL, MoTE paper section 3.2).

Under data parallelism accelerate shards the trainer's batch sampler by handing global batch `i` to
rank `i mod world_size` (`accelerate.data_loader.BatchSamplerShard`). sentence-transformers'
multi-dataset samplers choose a dataset per batch, so at one optimisation step the ranks would
train on different datasets: different tasks, prompts and temperatures in one gathered batch of
in-batch negatives. `TaskAwareBatchSampler` chooses a dataset per *step* instead and yields
`world_size` consecutive batches from it, so every rank draws from the same entry at every step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import accumulate

import torch
from sentence_transformers.base.sampler import MultiDatasetDefaultBatchSampler


def data_parallel_world_size() -> int:
    """Number of data-parallel processes: torch.distributed if initialised, else `$WORLD_SIZE`, else 1."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1"))


class TaskAwareBatchSampler(MultiDatasetDefaultBatchSampler):
    """Proportional sampling over datasets, one dataset per step across all data-parallel ranks.

    Each dataset contributes `len(its batch sampler) // world_size` steps, visited in a random
    order (seeded by `seed + epoch`); a step is `world_size` consecutive batches of that dataset.
    Every example is seen at most once per epoch; a dataset's last `< world_size` batches are left
    out of the epoch so that no step mixes datasets. Pass it as
    `SentenceTransformerTrainingArguments(multi_dataset_batch_sampler=TaskAwareBatchSampler)`.

    Args:
        dataset (`ConcatDataset`): The concatenated training datasets (one per entry).
        batch_samplers (`list[BatchSampler]`): One batch sampler per dataset.
        generator (`torch.Generator`, *optional*): Generator for the step order.
        seed (`int`, defaults to 0): Seed of the step order (plus the epoch).
        world_size (`int`, *optional*): Data-parallel processes (default: detected).
    """

    def __init__(self, dataset, batch_samplers, generator=None, seed: int = 0, world_size: int | None = None):
        super().__init__(dataset, batch_samplers, generator=generator, seed=seed)
        self.world_size = world_size or data_parallel_world_size()
        if self.world_size < 1:
            raise ValueError(f"world_size must be at least 1, got {self.world_size}")

    def steps_per_dataset(self) -> list[int]:
        """Optimisation steps each dataset contributes per epoch."""
        return [len(sampler) // self.world_size for sampler in self.batch_samplers]

    def __iter__(self) -> Iterator[list[int]]:
        generator = self.generator or torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        offsets = [0] + list(accumulate(len(d) for d in self.dataset.datasets))
        steps = [index for index, count in enumerate(self.steps_per_dataset()) for _ in range(count)]
        order = torch.randperm(len(steps), generator=generator).tolist()
        samplers = [iter(sampler) for sampler in self.batch_samplers]
        for position in order:
            dataset_index = steps[position]
            for _ in range(self.world_size):  # one batch per rank, all from this dataset
                yield [i + offsets[dataset_index] for i in next(samplers[dataset_index])]

    def __len__(self) -> int:
        return sum(self.steps_per_dataset()) * self.world_size
