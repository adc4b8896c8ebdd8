"""Task-aware batch sampling under data parallelism, simulated with accelerate's own sharding."""

from itertools import accumulate

import pytest
from accelerate.data_loader import BatchSamplerShard
from sentence_transformers.base.sampler import DefaultBatchSampler
from torch.utils.data import ConcatDataset

from moe_embed.training.sampler import TaskAwareBatchSampler

# Three datasets (entries), batch size 4: 16, 9 and 12 batches. No world size above 1 used here divides
# all three, so a step cannot line up with dataset boundaries by accident: only choosing the dataset
# per step keeps the ranks together.
SIZES = [64, 36, 48]
BATCH = 4
OFFSETS = list(accumulate(SIZES, initial=0))


def _datasets():
    return ConcatDataset([list(range(n)) for n in SIZES])


def _batch_samplers(concat):
    return [DefaultBatchSampler(d, batch_size=BATCH, drop_last=True) for d in concat.datasets]


def _dataset_of(batch: list[int]) -> int:
    found = {next(i for i in range(len(SIZES)) if OFFSETS[i] <= idx < OFFSETS[i + 1]) for idx in batch}
    assert len(found) == 1, "a batch mixes datasets"
    return found.pop()


def _per_rank_datasets(sampler, world_size: int) -> list[list[int]]:
    """Dataset of each step's batch on each rank, as accelerate's BatchSamplerShard hands them out."""
    ranks = []
    for rank in range(world_size):
        shard = BatchSamplerShard(sampler, num_processes=world_size, process_index=rank, split_batches=False)
        ranks.append([_dataset_of(batch) for batch in shard])
    return ranks


def _mixed_steps(ranks: list[list[int]]) -> list[tuple[int, ...]]:
    return [step for step in zip(*ranks, strict=True) if len(set(step)) > 1]


def test_choosing_the_dataset_per_batch_mixes_ranks_within_a_step():
    """The case the sampler exists for, and proof that the check below can fail: a sampler told
    `world_size=1` chooses a dataset per batch; sharded over 2 ranks, some steps then mix datasets."""
    concat = _datasets()
    per_batch = TaskAwareBatchSampler(concat, _batch_samplers(concat), seed=0, world_size=1)
    assert _mixed_steps(_per_rank_datasets(per_batch, 2))


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_task_aware_sampler_keeps_ranks_on_one_dataset_per_step(world_size, seed):
    concat = _datasets()
    sampler = TaskAwareBatchSampler(concat, _batch_samplers(concat), seed=seed, world_size=world_size)
    ranks = _per_rank_datasets(sampler, world_size)
    assert all(len(r) == len(ranks[0]) for r in ranks)
    assert not _mixed_steps(ranks)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    seen = [i for batch in batches for i in batch]
    assert len(seen) == len(set(seen))  # every example at most once per epoch
    expected = sum((n // BATCH) // world_size * world_size * BATCH for n in SIZES)
    assert len(seen) == expected  # and every example of the full steps is used
    # all datasets are visited, in a shuffled order
    assert set(ranks[0]) == set(range(len(SIZES))) and ranks[0] != sorted(ranks[0])


def test_task_aware_sampler_is_seeded_by_epoch():
    concat = _datasets()
    sampler = TaskAwareBatchSampler(concat, _batch_samplers(concat), seed=3, world_size=2)
    first, again = list(sampler), list(sampler)
    assert first == again
    sampler.set_epoch(1)
    assert list(sampler) != first
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        TaskAwareBatchSampler(concat, _batch_samplers(concat), world_size=-1)
