"""Task-aware batch sampling under data parallelism, simulated with accelerate's own sharding."""

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard
from sentence_transformers.base.sampler import DefaultBatchSampler, ProportionalBatchSampler, RoundRobinBatchSampler
from torch.utils.data import ConcatDataset

from training.sampler import TaskAwareBatchSampler

SIZES = [64, 32, 48]  # three datasets (entries), batch size 4
BATCH = 4


def _datasets():
    return ConcatDataset([list(range(n)) for n in SIZES])


def _batch_samplers(concat):
    return [DefaultBatchSampler(d, batch_size=BATCH, drop_last=True) for d in concat.datasets]


def _dataset_of(batch: list[int]) -> int:
    offsets = [0, 64, 96, 144]
    found = {next(i for i in range(3) if offsets[i] <= idx < offsets[i + 1]) for idx in batch}
    assert len(found) == 1, "a batch mixes datasets"
    return found.pop()


def _per_rank_datasets(sampler, world_size: int) -> list[list[int]]:
    """Dataset of each step's batch on each rank, as accelerate's BatchSamplerShard hands them out."""
    ranks = []
    for rank in range(world_size):
        shard = BatchSamplerShard(sampler, num_processes=world_size, process_index=rank, split_batches=False)
        ranks.append([_dataset_of(batch) for batch in shard])
    return ranks


@pytest.mark.parametrize("sampler_cls", [ProportionalBatchSampler, RoundRobinBatchSampler])
def test_default_samplers_put_ranks_on_different_datasets(sampler_cls):
    """The problem: with 2 ranks, sentence-transformers' samplers mix datasets within a step."""
    concat = _datasets()
    sampler = sampler_cls(concat, _batch_samplers(concat), generator=torch.Generator(), seed=0)
    rank0, rank1 = _per_rank_datasets(sampler, 2)
    assert any(a != b for a, b in zip(rank0, rank1, strict=True))


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_task_aware_sampler_keeps_ranks_on_one_dataset_per_step(world_size):
    concat = _datasets()
    sampler = TaskAwareBatchSampler(concat, _batch_samplers(concat), seed=0, world_size=world_size)
    ranks = _per_rank_datasets(sampler, world_size)
    assert all(len(r) == len(ranks[0]) for r in ranks)
    for step in zip(*ranks, strict=True):
        assert len(set(step)) == 1, step
    batches = list(sampler)
    assert len(batches) == len(sampler)
    seen = [i for batch in batches for i in batch]
    assert len(seen) == len(set(seen))  # every example at most once per epoch
    expected = sum((n // BATCH) // world_size * world_size * BATCH for n in SIZES)
    assert len(seen) == expected  # and every example of the full steps is used
    # all datasets are visited, in a shuffled order
    assert set(ranks[0]) == {0, 1, 2} and ranks[0] != sorted(ranks[0])


def test_task_aware_sampler_is_seeded_by_epoch():
    concat = _datasets()
    sampler = TaskAwareBatchSampler(concat, _batch_samplers(concat), seed=3, world_size=2)
    first, again = list(sampler), list(sampler)
    assert first == again
    sampler.set_epoch(1)
    assert list(sampler) != first
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        TaskAwareBatchSampler(concat, _batch_samplers(concat), world_size=-1)
