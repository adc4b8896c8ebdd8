"""MoTE's routing rule, the one copy: which expert a row of token ids reaches, and what the encoder reads of it.

Every way of calling a MoTE ends here with token ids: sentence-transformers (its prompt in front of the text, as
it tokenizes any model's input), `AutoModel`, the exported ONNX graph (this code, traced) and OpenVINO (that
graph), and every client built on one of them. So one text reaches one expert whoever calls the model.

The expert of a row, first that applies:

1. an explicit task: the call's `task=` (one name, or one per row), else a `task_ids` entry >= 0;
2. the task prefix the row's ids start with (after the tokenizer's leading special tokens), the longest that
   matches: a prefix is what the model's own tokenizer reads as it, so an uncased tokenizer routes
   `"Search_Query: ..."` and `"search_query:..."` as `"search_query: ..."`, and a prompt in front of a text that
   has its own prefix wins (it comes first);
3. the folder's default task (`config.default_task`); with none, the row has no expert (an error in PyTorch,
   NaN outputs in a graph).

Nothing is added to a row: the encoder reads the ids it is given, so the token outputs line up with the
caller's own attention mask. A folder whose prefixes only route (`config.prefix_routes_only`) reads a row as if
its prefix were not there: the prefix's tokens are masked out of attention, the text keeps the positions it has
without them, and their outputs are the mean of the row's other tokens, so mean pooling over the caller's mask
gives what the text alone gives.

`TaskRouter.route_batch` applies the rule to a batch and returns what the model's forward needs
(`RoutedBatch`): the expert of each row, the rows sorted by expert (each expert layer then runs each expert on one
contiguous run of rows, a no-op sort for a single-task batch), and the way back to the caller's row order.
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from .compat import exporting_program, is_exporting


@dataclass
class Route:
    """Routing of a batch: `task_ids`, the expert index per row (-1: none), and `prefix_length`, how many leading
    ids of each row its task prefix takes (leading special tokens included; 0: the row starts with none)."""

    task_ids: torch.LongTensor
    prefix_length: torch.LongTensor | None = None


@dataclass(frozen=True)
class MoteRouting:
    """What the expert layers read of a batch whose rows are sorted by task: `(expert, start_row, end_row)` for each
    task present, or, in a traced graph (`segments=None`), the expert index of each (sorted) row and, where the
    trace allows sizes that depend on the data (`torch.export`), how many rows each loaded expert takes
    (`row_counts`, in the order of the loaded experts)."""

    segments: tuple[tuple[int, int, int], ...] | None
    task_ids: torch.LongTensor | None = None
    row_counts: list | None = None


def active_expert_indices(config) -> list[int]:
    """Sorted indices of the tasks whose experts the model holds (names and aliases accepted)."""
    if config.active_tasks is None:
        return list(range(config.num_tasks))
    indices = sorted({config.task_index(name) for name in config.active_tasks})
    if not indices:
        raise ValueError(f"`active_tasks` must name at least one task. {config.describe_tasks()}")
    return indices


def take_rows(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """Rows `index` of `tensor`, passing through `None` and tensors broadcast over the batch."""
    if tensor is None or tensor.shape[0] != index.shape[0]:
        return tensor
    return tensor.index_select(0, index)


@dataclass
class RoutedBatch:
    """A batch as the expert layers read it, and the way back: `task_ids` (each row's expert, in the caller's
    order), `routing` (what the expert layers read), the `attention_mask` and `position_ids` the encoder reads
    (which hide the prefix in a prefix-routed folder), `order` (the rows in expert order; `None`: as given), and what
    `restore` does to the outputs: the prefix's positions to fill (`prefix`, under the mask the encoder read,
    `kept`) and, in a graph, the rows no loaded expert serves (`unrouted`), whose outputs become NaN."""

    task_ids: torch.LongTensor
    routing: MoteRouting
    attention_mask: torch.Tensor | None
    position_ids: torch.LongTensor | None
    batch_size: int
    order: torch.LongTensor | None = None
    prefix: torch.Tensor | None = None
    kept: torch.Tensor | None = None
    unrouted: torch.Tensor | None = None

    def take(self, *tensors: torch.Tensor | None) -> tuple:
        """Each of `tensors` with its rows in expert order (`None` and tensors broadcast over the batch as they
        are)."""
        if self.order is None:
            return tensors
        return tuple(take_rows(tensor, self.order) for tensor in tensors)

    def restore(self, output) -> dict:
        """`last_hidden_state`, `pooler_output`, `hidden_states` and `attentions` of the encoder's `output` in the
        caller's row order, with the prefix's outputs filled and unrouted rows NaN."""
        last, pooled = output.last_hidden_state, output.pooler_output
        hidden, attentions = output.hidden_states, output.attentions
        if self.order is not None:
            inverse = torch.empty_like(self.order)
            inverse[self.order] = torch.arange(self.batch_size, device=self.order.device)
            inverse = inverse.to(last.device)  # the last layer may sit on another device (device map)
            last = last.index_select(0, inverse)  # every row: not `take_rows`, whose size test a tracer cannot decide
            pooled = pooled.index_select(0, inverse) if pooled is not None else None
            hidden = tuple(h[inverse] for h in hidden) if hidden is not None else None
            attentions = tuple(a[inverse] for a in attentions) if attentions is not None else None
        if self.prefix is not None:  # the prefix's outputs: the mean of the text's, for poolers over the caller's mask
            last = TaskRouter.fill_prefix(last, self.prefix.to(last.device), self.kept.to(last.device))
        if self.unrouted is not None:  # graph outputs of rows with no task: NaN, the only error a graph can give
            # a product with 1 or NaN per row: one broadcast `Mul`, cheaper than a `Where` over every token
            poison = torch.ones_like(self.unrouted, dtype=last.dtype).masked_fill(self.unrouted, float("nan"))
            last = last * poison.view(-1, 1, 1)
            pooled = pooled * poison.view(-1, 1) if pooled is not None else None
        return {"last_hidden_state": last, "pooler_output": pooled, "hidden_states": hidden, "attentions": attentions}


class TaskRouter:
    """The rule above for one MoTE config: `route_batch()` routes a batch for the model's forward; its steps are
    `explicit()`, which reads the caller's choice, `route()`, which applies the rule by tensor ops only (a traced
    graph holds it), `check()`, which raises where the eager path cannot route a row, `hide_prefix()` /
    `fill_prefix()`, which make a prefix-routed folder read the text alone, and the sort of the rows by expert."""

    def __init__(self, config):
        self.config = config
        prefixes = [(config.tasks.index(t), ids) for t, ids in (config.task_prefix_ids or {}).items() if ids]
        self.prefixes = sorted(prefixes, key=lambda item: -len(item[1]))  # the longest first

    def explicit(self, task, task_ids, batch_size: int, device, check: bool = True) -> torch.LongTensor | None:
        """The caller's expert per row (-1: none given for that row), or `None` when it names none; `check=False`
        (a traced graph, which cannot raise) skips the checks of `task_ids`.

        Raises:
            ValueError: for an unknown task name, a count that is not one or one per row, or ids out of range.
        """
        config = self.config
        if isinstance(task, str):  # a full tensor, not a list: a traced batch size stays dynamic
            return torch.full((batch_size,), config.task_index(task), dtype=torch.long, device=device)
        if task is not None:
            names = list(task)
            if len(names) != batch_size:
                raise ValueError(
                    f"`task` holds {len(names)} names for a batch of {batch_size} rows; pass one name or one per row"
                )
            return torch.tensor([config.task_index(name) for name in names], dtype=torch.long, device=device)
        if task_ids is None:
            return None
        ids = torch.as_tensor(task_ids, device=device).long().reshape(-1)
        if ids.numel() == 1:
            ids = ids.expand(batch_size)
        if check:
            if ids.numel() != batch_size:
                raise ValueError(f"`task_ids` holds {ids.numel()} ids for a batch of {batch_size} rows")
            if bool(((ids < -1) | (ids >= config.num_tasks)).any()):
                raise ValueError(
                    f"`task_ids` must lie in -1..{config.num_tasks - 1} (tasks {config.tasks}; -1: read the row's "
                    f"prefix), got {ids.tolist()}"
                )
        return ids

    def match(self, input_ids: torch.Tensor) -> tuple[torch.LongTensor, torch.LongTensor]:
        """`(task, length)` of the prefix each row's ids start with: the longest that matches; `(-1, 0)` for none.
        Every prefix at once, with no branch on the row length: a traced graph holds a few ops, not a few per
        task."""
        rows = input_ids.shape[0]
        if not self.prefixes:
            none = torch.full((rows,), -1, dtype=torch.long, device=input_ids.device)
            return none, torch.zeros_like(none)
        longest = len(self.prefixes[0][1])
        # prefixes padded with -2 (no token id), rows with -1: a row shorter than a prefix does not match it
        table = torch.full((len(self.prefixes), longest), -2, dtype=input_ids.dtype, device=input_ids.device)
        for index, (_, ids) in enumerate(self.prefixes):
            table[index, : len(ids)] = torch.tensor(ids, dtype=input_ids.dtype)
        lengths = torch.tensor([len(ids) for _, ids in self.prefixes], device=input_ids.device)
        head = torch.nn.functional.pad(input_ids, (0, longest), value=-1)[:, :longest]
        matches = (head.unsqueeze(1) == table).sum(dim=2) == lengths  # (rows, prefixes), the longest first
        first = matches.to(torch.int32).argmax(dim=1)  # the first (longest) match; 0 where none
        tasks = torch.tensor([task for task, _ in self.prefixes], device=input_ids.device)
        found = matches.any(dim=1)
        return torch.where(found, tasks[first], -1), torch.where(found, lengths[first], 0)

    def route(self, input_ids: torch.Tensor | None, explicit: torch.LongTensor | None, batch_size: int) -> Route:
        """Each row's expert by the rule (tensor ops only); -1 where none applies."""
        if input_ids is None:  # `inputs_embeds`: no ids to read a prefix from
            device = explicit.device if explicit is not None else None
            found, length = torch.full((batch_size,), -1, dtype=torch.long, device=device), None
        else:
            found, length = self.match(input_ids)
        ids = found if explicit is None else torch.where(explicit >= 0, explicit, found)
        default = self.config.default_task_index
        return Route(ids.masked_fill(ids < 0, default) if default >= 0 else ids, length)

    def check(self, route: Route) -> None:
        """Raise, naming the valid tasks, where a row has no expert (the eager path; a graph gives NaN there)."""
        unresolved = route.task_ids < 0
        if bool(unresolved.any()):
            rows = unresolved.nonzero().flatten().tolist()
            raise ValueError(
                f"Cannot tell the task of {len(rows)} of {route.task_ids.shape[0]} rows (rows {rows[:10]}"
                f"{'...' if len(rows) > 10 else ''} of this batch): pass `task=` (one name or one per row), "
                f"`task_ids=`, or start the text with a task prefix. {self.config.describe_tasks()}"
            )

    def hide_prefix(self, route: Route, attention_mask: torch.Tensor, offset: int = 0):
        """`(attention_mask, position_ids, prefix)` under which the encoder reads each row without its task prefix
        (`prefix`: the positions of the prefix's own tokens, after the leading special tokens)."""
        start = self.config.task_prefix_start
        width = attention_mask.shape[1]
        position = torch.arange(width, device=attention_mask.device).unsqueeze(0)
        prefix = (position >= start) & (position < route.prefix_length.to(attention_mask.device).unsqueeze(1))
        keep = attention_mask.bool() & ~prefix
        mask = keep.to(attention_mask.dtype)
        position_ids = offset + (torch.cumsum(mask.long(), dim=1) - 1).clamp(min=0)
        return mask, position_ids, prefix

    @staticmethod
    def fill_prefix(last_hidden_state: torch.Tensor, prefix: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """The prefix's positions of `last_hidden_state` set to the mean of the row's kept tokens (`kept`: the
        mask the encoder read)."""
        weights = kept.to(last_hidden_state.dtype).unsqueeze(-1)
        mean = (last_hidden_state * weights).sum(dim=1, keepdim=True) / weights.sum(dim=1, keepdim=True).clamp(min=1)
        return torch.where(prefix.unsqueeze(-1), mean, last_hidden_state)

    def route_batch(
        self,
        input_ids: torch.LongTensor | None,
        inputs_embeds: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        position_ids: torch.LongTensor | None,
        task=None,
        task_ids=None,
        position_offset: int = 0,
        check_experts: Callable[[list[int]], None] = lambda experts: None,
    ) -> RoutedBatch:
        """The batch routed by the rule, for the model's forward: a single task name (and no prefix to hide) is one
        expert known before the graph, with no routing ops; otherwise each row's expert by the rule, the rows
        sorted by expert. `check_experts` raises for requested experts the model does not hold (eager only).

        Raises:
            ValueError: for an empty batch, an unknown task, or (eager) a row with no expert.
        """
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None:
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`")
        batch_size = reference.shape[0]
        if batch_size == 0:
            raise ValueError("Got an empty batch: `input_ids` has 0 rows")
        exporting = is_exporting()
        explicit = self.explicit(task, task_ids, batch_size, reference.device, check=not exporting)
        hide = self.config.prefix_routes_only and input_ids is not None
        if isinstance(task, str) and not hide:  # one expert, known before the graph: no routing ops at all
            index = self.config.task_index(task)
            check_experts([index])
            return RoutedBatch(
                explicit, MoteRouting(((index, 0, batch_size),)), attention_mask, position_ids, batch_size
            )
        route = self.route(input_ids, explicit, batch_size)
        prefix = None
        if hide:  # the encoder reads the text as if its prefix were not there
            if attention_mask is None:
                attention_mask = torch.ones_like(input_ids)
            attention_mask, strip_positions, prefix = self.hide_prefix(route, attention_mask, position_offset)
            position_ids = strip_positions if position_ids is None else position_ids
        if exporting and task is None:
            routing, order, unrouted = self.graph_routing(route.task_ids)
        else:
            self.check(route)
            (routing, order), unrouted = self.sorted_routing(route.task_ids, check_experts), None
        kept = attention_mask if prefix is not None else None  # the mask the encoder reads, in the caller's order
        return RoutedBatch(
            route.task_ids, routing, attention_mask, position_ids, batch_size, order, prefix, kept, unrouted
        )

    def sorted_routing(self, ids: torch.Tensor, check_experts: Callable[[list[int]], None]):
        """`(routing, order)`: the segments of the task-sorted batch and the sorting order (`None` for a single-task
        batch); one host sync, for the eager path."""
        batch_size = ids.shape[0]
        counts = torch.bincount(ids, minlength=self.config.num_tasks).tolist()
        check_experts([i for i, count in enumerate(counts) if count])
        order = torch.argsort(ids, stable=True) if max(counts) < batch_size else None
        segments, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                segments.append((expert, start, start + count))
                start += count
        return MoteRouting(tuple(segments)), order

    def graph_routing(self, ids: torch.Tensor):
        """`(routing, order, unrouted)` by tensor ops only, for a traced graph: the rows sorted by expert as the
        eager path sorts them, and the rows with no loaded expert, which run through the first expert and come out
        NaN."""
        indices = active_expert_indices(self.config)
        unrouted = ~(ids.unsqueeze(1) == torch.tensor(indices, device=ids.device)).any(1)
        experts = ids.masked_fill(unrouted, indices[0])
        # unique keys, so the sort is stable without a stable sort (which not every graph format has)
        order = torch.argsort(experts * ids.shape[0] + torch.arange(ids.shape[0], device=ids.device))
        return MoteRouting(None, experts[order], self.row_counts(experts, indices)), order, unrouted

    @staticmethod
    def row_counts(experts: torch.Tensor, indices: list[int]) -> list | None:
        """Rows per loaded expert, for `torch.export` (data-dependent sizes: one split that every expert layer
        reads); `None` under `torch.compile` or a tracer, whose shapes are static."""
        if not exporting_program():
            return None
        counts = (experts.unsqueeze(1) == torch.tensor(indices, device=experts.device)).sum(0).tolist()
        for count in counts:
            torch._check(count >= 0)
        torch._check(sum(counts) == experts.shape[0])  # every row has one loaded expert
        return counts


__all__ = ["Route", "MoteRouting", "RoutedBatch", "TaskRouter", "active_expert_indices", "take_rows"]
