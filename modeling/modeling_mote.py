"""MoTE: Mixture of Task Experts (Romero et al., 2025, "MoTE: Mixture of Task Experts for
Multi-task Embedding Models").

Expert layers hold one expert per task. An expert is the part of a post-LN BERT layer after the
attention projection: `attention.output.LayerNorm`, `intermediate.dense`, `output.dense` and
`output.LayerNorm` (the paper's "LayerNorm + MLP + LayerNorm"). Every token of a sequence goes
through the expert of the sequence's task; the task comes from an explicit `task`/`task_ids`
argument or from the instruction prefix the text starts with.

A batch is routed once per forward pass: rows are stably sorted by task (a no-op for a
single-task batch), every expert layer applies each expert to one contiguous slice of rows, and
the outputs are put back in input order at the end.
"""

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

# transformers 4.x copies only the direct relative imports of a folder's model file into its module cache,
# so every sibling this file needs, directly or not, is imported here by name.
from .compat import exporting_program, is_exporting
from .configuration_encoder import EncoderConfig  # noqa: F401
from .configuration_mote import MoteBertConfig
from .defaults import DEFAULT_TASK  # noqa: F401
from .modeling_encoder import EncoderIntermediate, EncoderLayer, EncoderOutput, EncoderPreTrainedModel


@dataclass
class MoteModelOutput(BaseModelOutputWithPooling):
    r"""
    Output of [`MoteBertModel`].

    task_ids (`torch.LongTensor` of shape `(batch_size,)`):
        Index into `config.tasks` of the expert each row was routed to.
    """

    task_ids: torch.LongTensor | None = None


@dataclass(frozen=True)
class MoteRouting:
    """Routing of one batch, whose rows are sorted by task: `(expert, start_row, end_row)` for each task present,
    or, in a traced graph (`segments=None`), the expert index of each (sorted) row and, in an exported graph,
    how many of the batch's tokens each loaded expert takes (`token_counts`, in the order of `experts`' keys)."""

    segments: tuple[tuple[int, int, int], ...] | None
    task_ids: torch.LongTensor | None = None
    token_counts: list | None = None


class MoteBertExpert(nn.Module):
    """One task expert: attention-output LayerNorm, then BERT's feed-forward block."""

    def __init__(self, config: MoteBertConfig):
        super().__init__()
        self.attention_LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = EncoderIntermediate(config)
        self.output = EncoderOutput(config)

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        # residual: (rows, seq, hidden), the attention projection plus its input, before the norm
        attention_output = self.attention_LayerNorm(residual)
        return self.output(self.intermediate(attention_output), attention_output)


class MoteBertLayer(EncoderLayer):
    """A layer whose post-attention LayerNorm and feed-forward block are per-task experts."""

    attention_norm_in_layer = False

    def build_feed_forward(self, config: MoteBertConfig) -> None:
        # Keyed by task index, so parameter names (`experts.2.…`) do not depend on which are loaded.
        self.experts = nn.ModuleDict({str(i): MoteBertExpert(config) for i in active_expert_indices(config)})

    def feed_forward(self, attention_output: torch.Tensor, routing: MoteRouting):
        if routing.segments is None and not exporting_program():  # torch.compile: static shapes
            output = torch.zeros_like(attention_output)
            task_ids = routing.task_ids.to(attention_output.device)
            for key, expert in self.experts.items():
                rows = (task_ids == int(key)).nonzero().squeeze(-1)
                output = output.index_copy(0, rows, expert(attention_output.index_select(0, rows)))
            return output, None
        if routing.segments is None:  # an exported graph: each expert on its run of the sorted batch's tokens
            # flattened to (tokens, hidden), one `Split` feeds every expert and their LayerNorms need no reshaping
            # (`convert/onnx_layout.py`): per expert, its own ops and nothing else
            tokens = attention_output.reshape(-1, attention_output.shape[-1])
            parts = tokens.split(routing.token_counts)
            output = torch.cat([expert(part) for expert, part in zip(self.experts.values(), parts, strict=True)])
            return output.view(attention_output.shape), None
        if len(routing.segments) == 1:
            return self.experts[str(routing.segments[0][0])](attention_output), None
        # One call per task present, each on a contiguous slice of rows (a view, no gather).
        return torch.cat(
            [self.experts[str(expert)](attention_output[start:end]) for expert, start, end in routing.segments]
        ), None


def active_expert_indices(config: MoteBertConfig) -> list[int]:
    """Sorted indices of the tasks whose experts the model holds (names and aliases accepted)."""
    if config.active_tasks is None:
        return list(range(config.num_tasks))
    indices = sorted({config.task_index(name) for name in config.active_tasks})
    if not indices:
        raise ValueError(f"`active_tasks` must name at least one task. {config.describe_tasks()}")
    return indices


def detect_task_ids(input_ids: torch.Tensor, config: MoteBertConfig) -> torch.LongTensor:
    """Task of each row from the instruction prefix its tokens start with; -1 where none matches.

    Prefixes are compared as token ids (`config.task_prefix_ids`, leading special tokens included);
    the longest matching prefix wins. Every prefix at once: a traced graph holds a few ops, not a few per task.
    """
    prefixes = sorted(((t, ids) for t, ids in (config.task_prefix_ids or {}).items() if ids), key=lambda x: -len(x[1]))
    if not prefixes:
        return torch.full(input_ids.shape[:1], -1, dtype=torch.long, device=input_ids.device)
    longest = len(prefixes[0][1])
    # Each prefix padded with -2 (no token id) and each row with -1, so that a row shorter than a prefix simply
    # does not match it, with no branch on the sequence length (graph-safe); a row matches a prefix whose every
    # id it repeats.
    table = torch.full((len(prefixes), longest), -2, dtype=input_ids.dtype, device=input_ids.device)
    for index, (_, ids) in enumerate(prefixes):
        table[index, : len(ids)] = torch.tensor(ids, dtype=input_ids.dtype)
    lengths = torch.tensor([len(ids) for _, ids in prefixes], device=input_ids.device)
    head = nn.functional.pad(input_ids, (0, longest), value=-1)[:, :longest]
    matches = (head.unsqueeze(1) == table).sum(dim=2) == lengths  # (rows, prefixes), longest first
    first = matches.to(torch.int32).argmax(dim=1)  # the first (longest) match, 0 where none
    tasks = torch.tensor([config.tasks.index(task) for task, _ in prefixes], device=input_ids.device)
    return torch.where(matches.any(dim=1), tasks[first], torch.full_like(first, -1, dtype=torch.long))


def route_rows(*candidates: torch.Tensor, default: int = -1) -> torch.LongTensor:
    """MoTE's routing rule, the one copy: per row, the first candidate that names an expert (>= 0), else
    `default` (-1: none). Candidates come in order of precedence, explicit choices before the instruction
    prefix found in the row: the model passes `task_ids` and the prefix of `input_ids`, the
    Sentence-Transformers module the call's task, the prompt's and the text's own prefix, the ONNX graph's
    input step `task_ids` and the prefix. Tensor ops only, so a traced graph holds it."""
    ids = candidates[-1]
    for candidate in reversed(candidates[:-1]):
        ids = torch.where(candidate >= 0, candidate, ids)
    return ids.masked_fill(ids < 0, default) if default >= 0 else ids


def resolve_task_ids(
    config: MoteBertConfig, batch_size: int, device, task=None, task_ids=None, input_ids=None
) -> torch.LongTensor:
    """Expert index per row: `task` > `task_ids` (-1: none for that row) > instruction prefix in `input_ids` >
    `default_task`.

    Raises:
        ValueError: for an unknown task name, a wrong number of tasks, out-of-range ids, or rows
            whose task cannot be determined (the message lists valid tasks and prefixes).
    """
    if task is not None:
        names = [task] * batch_size if isinstance(task, str) else list(task)
        if len(names) != batch_size:
            raise ValueError(
                f"`task` holds {len(names)} names for a batch of {batch_size} rows; pass one name or one per row"
            )
        return torch.tensor([config.task_index(name) for name in names], dtype=torch.long, device=device)
    if task_ids is not None:
        ids = torch.as_tensor(task_ids, dtype=torch.long, device=device).reshape(-1)
        if ids.numel() == 1:
            ids = ids.expand(batch_size)
        if ids.numel() != batch_size:
            raise ValueError(f"`task_ids` holds {ids.numel()} ids for a batch of {batch_size} rows")
        if bool(((ids < -1) | (ids >= config.num_tasks)).any()):
            raise ValueError(
                f"`task_ids` must lie in -1..{config.num_tasks - 1} (tasks {config.tasks}; -1: read the row's "
                f"prefix), got {ids.tolist()}"
            )
    else:
        ids = torch.full((batch_size,), -1, dtype=torch.long, device=device)
    found = detect_task_ids(input_ids, config) if input_ids is not None else torch.full_like(ids, -1)
    ids = route_rows(ids, found.to(ids.device), default=config.default_task_index)
    unresolved = ids < 0
    if bool(unresolved.any()):
        rows = unresolved.nonzero().flatten().tolist()
        raise ValueError(
            f"Cannot tell the task of {len(rows)} of {batch_size} rows (rows {rows[:10]}"
            f"{'...' if len(rows) > 10 else ''} of this batch): pass `task=` "
            f"(one name or one per row), `task_ids=`, or start the text with a task prefix. "
            f"{config.describe_tasks()}"
        )
    return ids


def graph_task_ids(
    config: MoteBertConfig, input_ids: torch.Tensor, task_ids=None, by_prefix: bool = True
) -> torch.LongTensor:
    """Expert index per row by tensor ops only: a `task_ids` entry >= 0 wins, a row with -1 (or no
    `task_ids`) is routed by its prefix (unless `by_prefix` is False), then `config.default_task`; -1 where none
    of these resolve it. The part of `resolve_task_ids` a traced graph can run: it cannot raise, so the forward
    pass gives the rows left unrouted (or with an id out of range) NaN outputs there."""
    given = ()
    if task_ids is not None:
        given = (torch.as_tensor(task_ids, device=input_ids.device).long().reshape(-1).expand(input_ids.shape[0]),)
    found = (detect_task_ids(input_ids, config),) if by_prefix else ()
    candidates = given + found or (torch.full_like(input_ids[:, 0], -1),)
    return route_rows(*candidates, default=config.default_task_index)


class MoteBertPreTrainedModel(EncoderPreTrainedModel):
    """Base class of MoTE models: config class and module names for device maps."""

    config_class = MoteBertConfig
    _no_split_modules = ["EncoderEmbeddings", "EncoderLayer", "MoteBertLayer"]


class MoteBertModel(MoteBertPreTrainedModel):
    """BERT encoder with per-task experts in `config.expert_layers`, routed per sequence.

    Example:

    ```python
    >>> model = AutoModel.from_pretrained("models/mote-minilm", trust_remote_code=True)
    >>> batch = tokenizer(["search_query: who was newton?"], return_tensors="pt")
    >>> model(**batch).last_hidden_state            # expert chosen from the prefix
    >>> model(**batch, task="query").pooler_output  # or named explicitly
    ```
    """

    def __init__(self, config: MoteBertConfig, active_tasks: list[str] | None = None):
        r"""
        active_tasks (`list[str]`, *optional*): Overrides `config.active_tasks`, so that
            `from_pretrained(..., active_tasks=[...])` works also when a config object is passed (as
            Sentence-Transformers does with `model_kwargs`).
        """
        if active_tasks is not None or config.active_tasks is not None:
            # The model owns the normalised list; the caller's config object is left as it was.
            config = copy.deepcopy(config)
            if active_tasks is not None:
                config.active_tasks = list(active_tasks)
        active = active_expert_indices(config)
        if config.active_tasks is not None:
            config.active_tasks = [config.tasks[i] for i in active]
        super().__init__(config)
        self.build_encoder(MoteBertLayer, config.expert_layers)
        inactive = sorted(set(range(config.num_tasks)) - set(active))
        if inactive:  # their tensors in a checkpoint are expected and left unread
            self._keys_to_ignore_on_load_unexpected = [
                rf"encoder\.layer\.\d+\.experts\.({'|'.join(map(str, inactive))})\."
            ]
        self.post_init()

    def set_active_tasks(self, tasks: list[str], offload_device: str | torch.device | None = None) -> None:
        """Keep the experts of `tasks` on the model's device; drop the others, or move them to `offload_device`.

        Dropped experts are gone until the model is reloaded; offloaded ones come back with another
        call that names their task. Requesting a task whose experts are not here raises a `ValueError`.
        """
        keep = [self.config.tasks[self.config.task_index(name)] for name in tasks]
        if not keep:
            raise ValueError(f"`tasks` must name at least one task. {self.config.describe_tasks()}")
        keep_ids = {str(self.config.tasks.index(task)) for task in keep}
        device = self.embeddings.word_embeddings.weight.device
        for layer_idx in self.config.expert_layers:
            experts = self.encoder.layer[layer_idx].experts
            missing = keep_ids - set(experts.keys())
            if missing:
                raise ValueError(
                    f"experts of tasks {[self.config.tasks[int(i)] for i in sorted(missing)]} were dropped; reload "
                    f"the model to get them back"
                )
            for key in list(experts.keys()):
                if key in keep_ids:
                    experts[key].to(device)
                elif offload_device is None:
                    del experts[key]
                else:
                    experts[key].to(offload_device)
        if offload_device is None:
            self.config.active_tasks = [t for t in self.config.tasks if t in keep]

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        task: str | list[str] | None = None,
        task_ids: torch.LongTensor | list[int] | int | None = None,
        route_by_prefix: bool = True,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> MoteModelOutput | tuple:
        r"""
        task (`str` or `list[str]`, *optional*): Task of the whole batch, or one per row. Names from
            `config.tasks` or `config.task_aliases`.
        task_ids (`torch.LongTensor` of shape `(batch_size,)` or `int`, *optional*): Expert index per
            row (into `config.tasks`); -1 routes that row by its prefix. Used when `task` is not given.
        route_by_prefix (`bool`, *optional*, defaults to `True`): `False` reads no row's prefix: a row without a
            task is the default task's (the ONNX graph's input step has read the prompts already).
        return_dict (`bool`, *optional*): `False` returns a tuple instead of a `MoteModelOutput`.

        Without either, each row's task is read from the instruction prefix its `input_ids` start
        with, then `config.default_task`; otherwise a `ValueError` lists the valid tasks.
        """
        reference = input_ids if input_ids is not None else inputs_embeds
        if reference is None:
            raise ValueError("Pass exactly one of `input_ids` or `inputs_embeds`")
        batch_size = reference.shape[0]
        if batch_size == 0:
            raise ValueError("Got an empty batch: `input_ids` has 0 rows")
        order, unrouted = None, None
        if isinstance(task, str):  # one expert, known before the graph: no routing ops at all
            index = self.config.task_index(task)
            self._check_experts_present([index])
            ids = torch.full((batch_size,), index, dtype=torch.long, device=reference.device)
            routing = MoteRouting(((index, 0, batch_size),))
        elif is_exporting() and task is None and input_ids is not None:
            routing, order, ids, unrouted = self._graph_routing(input_ids, task_ids, route_by_prefix)
        else:
            prefixed = input_ids if route_by_prefix else None
            ids = resolve_task_ids(self.config, batch_size, reference.device, task, task_ids, prefixed)
            routing, order = self._sorted_routing(ids, batch_size)
        if order is not None:
            input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = (
                _take_rows(t, order) for t in (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
            )

        backbone = self.forward_backbone(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            routing=routing,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        last, pooled, hidden, attentions = (
            backbone.last_hidden_state,
            backbone.pooler_output,
            backbone.hidden_states,
            backbone.attentions,
        )
        if order is not None:
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(batch_size, device=order.device)
            inverse = inverse.to(last.device)  # the last layer may sit on another device (device map)
            last = last.index_select(0, inverse)  # every row: not `_take_rows`, whose size test a tracer cannot decide
            pooled = pooled.index_select(0, inverse) if pooled is not None else None
            hidden = tuple(h[inverse] for h in hidden) if hidden is not None else None
            attentions = tuple(a[inverse] for a in attentions) if attentions is not None else None
        if unrouted is not None:  # graph outputs of rows with no task: NaN, the only error a graph can give
            # a product with 1 or NaN per row: one broadcast `Mul`, cheaper than a `Where` over every token
            poison = torch.ones_like(unrouted, dtype=last.dtype).masked_fill(unrouted, float("nan"))
            last = last * poison.view(-1, 1, 1)
            pooled = pooled * poison.view(-1, 1) if pooled is not None else None
        output = MoteModelOutput(
            last_hidden_state=last, pooler_output=pooled, hidden_states=hidden, attentions=attentions, task_ids=ids
        )
        return output if return_dict is not False else output.to_tuple()

    def _sorted_routing(self, ids: torch.Tensor, batch_size: int) -> tuple[MoteRouting, torch.Tensor | None]:
        """Segments of the task-sorted batch and the sorting order (`None` for a single-task batch); one host
        sync, for the eager path."""
        counts = torch.bincount(ids, minlength=self.config.num_tasks).tolist()
        self._check_experts_present([i for i, count in enumerate(counts) if count])
        order = torch.argsort(ids, stable=True) if max(counts) < batch_size else None
        segments, start = [], 0
        for expert, count in enumerate(counts):
            if count:
                segments.append((expert, start, start + count))
                start += count
        return MoteRouting(tuple(segments)), order

    def _graph_routing(self, input_ids: torch.Tensor, task_ids=None, by_prefix: bool = True):
        """`(routing, order, ids, unrouted)` by tensor ops only, for a traced graph: each row's expert
        (`graph_task_ids`), the rows sorted by it as the eager path sorts them, and the rows with no loaded
        expert, which run through the first expert and come out NaN."""
        ids = graph_task_ids(self.config, input_ids, task_ids, by_prefix)
        indices = active_expert_indices(self.config)
        unrouted = ~(ids.unsqueeze(1) == torch.tensor(indices, device=ids.device)).any(1)
        experts = ids.masked_fill(unrouted, indices[0])
        # unique keys, so the sort is stable without a stable sort (which ONNX has not)
        order = torch.argsort(experts * ids.shape[0] + torch.arange(ids.shape[0], device=ids.device))
        return MoteRouting(None, experts[order], self._token_counts(experts, indices, input_ids)), order, ids, unrouted

    @staticmethod
    def _token_counts(experts: torch.Tensor, indices: list[int], input_ids: torch.Tensor) -> list | None:
        """Tokens per loaded expert, for `torch.export` (data-dependent sizes: one `Split` that every expert layer
        reads); `None` under `torch.compile` or a tracer, whose shapes are static."""
        if not exporting_program():
            return None
        rows = (experts.unsqueeze(1) == torch.tensor(indices, device=experts.device)).sum(0)
        counts = (rows * input_ids.shape[1]).tolist()
        for count in counts:
            torch._check(count >= 0)
        torch._check(sum(counts) == input_ids.shape[0] * input_ids.shape[1])  # every row has one loaded expert
        return counts

    def _check_experts_present(self, experts: list[int]) -> None:
        """Raise a clear error when a requested task's experts were dropped or offloaded."""
        layer = self.encoder.layer[self.config.expert_layers[0]]
        for expert in experts:
            task = self.config.tasks[expert]
            module = layer.experts[str(expert)] if str(expert) in layer.experts else None
            if module is None:
                raise ValueError(
                    f"Task {task!r} is not loaded: this model holds the experts of {self.config.active_tasks}. "
                    f"Load it without `active_tasks` (or with {task!r} in it) to use this task."
                )
            # Compared with the layer's own attention, not the input: under a device map the layer may sit
            # on another device, or on `meta` while accelerate offloads it to CPU or disk (it brings the
            # whole layer's weights at its forward); only `set_active_tasks` separates experts from their layer.
            where = module.attention_LayerNorm.weight.device
            if where != layer.attention.self.query.weight.device:
                raise ValueError(
                    f"The experts of task {task!r} are offloaded to {where}; call "
                    f"`model.set_active_tasks([..., {task!r}], offload_device=...)` to bring them back."
                )


def _take_rows(tensor: torch.Tensor | None, index: torch.Tensor) -> torch.Tensor | None:
    """Rows `index` of `tensor`, passing through `None` and tensors broadcast over the batch."""
    if tensor is None or tensor.shape[0] != index.shape[0]:
        return tensor
    return tensor.index_select(0, index)


__all__ = ["MoteBertModel", "MoteBertPreTrainedModel", "MoteBertLayer", "MoteBertExpert", "MoteModelOutput"]
