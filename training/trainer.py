"""Data-parallel training of expert models with sentence-transformers' trainer.

`DistributedDataParallel` synchronises gradients from inside the model's forward and backward:
it expects one forward pass per backward pass and, with `find_unused_parameters=True`, refuses a
second (sentence-transformers' contrastive losses embed the anchor column in a pass of its own);
with `find_unused_parameters=False` it refuses parameters that got no gradient (the experts of the
other tasks in a MoTE step, unrouted experts in a token-routed MoE). `TaskAwareTrainer` runs the
wrapped model under `no_sync()` and averages the gradients itself after the backward pass, with
DDP's rule for missing gradients: a parameter that has a gradient on some rank gets the average
(zeros where it had none); one with no gradient on any rank keeps none, so the optimizer skips it
as it would in a single process.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from sentence_transformers import SentenceTransformerTrainer
from torch.nn.parallel import DistributedDataParallel


def average_gradients(parameters, world_size: int) -> None:
    """All-reduce the mean gradient of `parameters` across the process group (DDP's missing-gradient rule)."""
    params = [p for p in parameters if p.requires_grad]
    if not params:
        return
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=params[0].device)
    dist.all_reduce(has_grad)
    used = [p for p, count in zip(params, has_grad.tolist(), strict=True) if count]
    if not used:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in used]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p in used:
        p.grad = flat[offset : offset + p.numel()].view_as(p)  # views of one buffer: no second copy
        offset += p.numel()


class TaskAwareTrainer(SentenceTransformerTrainer):
    """`SentenceTransformerTrainer` whose data-parallel gradient averaging works for expert models.

    Single-process training is unchanged. Under `torchrun` or `accelerate launch` each step's
    gradients are averaged across ranks after the backward pass (see the module docstring). With
    `TaskAwareBatchSampler` every rank trains the same entry at each step, so the ranks agree on
    which parameters they train.
    """

    learning_rates: list[tuple[list, float]] | None = None  # [(parameters, peak learning rate), ...]

    def create_optimizer(self, model=None):
        """The trainer's optimizer, its parameter groups (weight decay or not) split further by peak learning
        rate when `learning_rates` is set (shared and expert parameters); the schedule then scales every
        group by the same factor."""
        created = self.optimizer is None
        optimizer = super().create_optimizer(model)
        if created and self.learning_rates:
            rate_of = {id(p): rate for params, rate in self.learning_rates for p in params}
            groups = []
            for group in optimizer.param_groups:
                by_rate: dict[float, list] = {}
                for p in group["params"]:
                    by_rate.setdefault(rate_of.get(id(p), group["lr"]), []).append(p)
                groups += [{**group, "params": params, "lr": rate} for rate, params in by_rate.items()]
            optimizer.param_groups[:] = groups  # no state yet: regrouping the parameters is all it takes
        return self.optimizer

    def training_step(self, model, inputs, num_items_in_batch=None):
        if not isinstance(model, DistributedDataParallel):
            return super().training_step(model, inputs, num_items_in_batch)
        with model.no_sync():
            loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients:  # the last micro-batch of a gradient-accumulation step
            average_gradients(model.module.parameters(), self.accelerator.num_processes)
        return loss
