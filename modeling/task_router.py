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
"""

from dataclasses import dataclass

import torch


@dataclass
class Route:
    """Routing of a batch: `task_ids`, the expert index per row (-1: none), and `prefix_length`, how many leading
    ids of each row its task prefix takes (leading special tokens included; 0: the row starts with none)."""

    task_ids: torch.LongTensor
    prefix_length: torch.LongTensor | None = None


class TaskRouter:
    """The rule above for one MoTE config: `explicit()` reads the caller's choice, `route()` applies the rule by
    tensor ops only (a traced graph holds it), `check()` raises where the eager path cannot route a row, and
    `hide_prefix()` / `fill_prefix()` make a prefix-routed folder read the text alone."""

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


__all__ = ["Route", "TaskRouter"]
