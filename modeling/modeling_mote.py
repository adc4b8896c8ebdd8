"""MoTE: Mixture of Task Experts (Romero et al., 2025, "MoTE: Mixture of Task Experts for
Multi-task Embedding Models").

Expert layers hold one expert per task. An expert is the part of a layer after the attention projection: in a
post-LN layer `attention.output.LayerNorm`, `intermediate.dense`, `output.dense` and `output.LayerNorm` (the paper's
"LayerNorm + MLP + LayerNorm"); in a pre-norm layer `feed_forward_norm`, `intermediate.dense` and `output.dense`.
Every token of a sequence goes through the expert of the sequence's task, chosen by the routing rule of
`task_router.py` (an explicit `task`/`task_ids`, else the instruction prefix the ids start with, else the default
task).

A batch is routed once per forward pass, by the router (`TaskRouter.route_batch`): rows are stably sorted by
task (a no-op for a single-task batch), every expert layer applies each expert to one contiguous slice of rows,
and the outputs are put back in input order at the end (`RoutedBatch.restore`).
"""

import copy
from dataclasses import dataclass

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutputWithPooling

from .configuration_mote import MoteBertConfig
from .modeling_encoder import EncoderIntermediate, EncoderLayer, EncoderOutput, EncoderPreTrainedModel, layer_norm
from .task_router import MoteRouting, TaskRouter, active_expert_indices


@dataclass
class MoteModelOutput(BaseModelOutputWithPooling):
    r"""
    Output of [`MoteBertModel`].

    task_ids (`torch.LongTensor` of shape `(batch_size,)`):
        Index into `config.tasks` of the expert each row was routed to.
    """

    task_ids: torch.LongTensor | None = None


class MoteBertExpert(nn.Module):
    """One task expert: what a layer computes after its attention. In a post-LN layer (BERT, MPNet) the
    attention-output LayerNorm, then the feed-forward block with its output LayerNorm (the paper's "LayerNorm + MLP
    + LayerNorm"); in a pre-norm layer (ModernBERT) the feed-forward block's input norm and the block."""

    def __init__(self, config: MoteBertConfig):
        super().__init__()
        if config.prenorm:
            self.feed_forward_norm = layer_norm(config)
        else:
            self.attention_LayerNorm = layer_norm(config)
        self.intermediate = EncoderIntermediate(config)
        self.output = EncoderOutput(config)
        self.prenorm = config.prenorm

    def forward(self, residual: torch.Tensor) -> torch.Tensor:
        # residual: (rows, seq, hidden), the attention projection plus its input, before any norm
        if self.prenorm:
            return self.output(self.intermediate(self.feed_forward_norm(residual)), residual)
        attention_output = self.attention_LayerNorm(residual)
        return self.output(self.intermediate(attention_output), attention_output)


class MoteBertLayer(EncoderLayer):
    """A layer whose post-attention LayerNorm and feed-forward block are per-task experts."""

    attention_norm_in_layer = False

    def build_feed_forward(self, config: MoteBertConfig) -> None:
        # Keyed by task index, so parameter names (`experts.2.…`) do not depend on which are loaded.
        self.experts = nn.ModuleDict({str(i): MoteBertExpert(config) for i in active_expert_indices(config)})

    def feed_forward(self, attention_output: torch.Tensor, routing: MoteRouting):
        """Eager: one call per task present, each on its contiguous run of the task-sorted rows (a view, no
        gather). In a traced graph: `graph_feed_forward`."""
        if routing.segments is None:
            return self.graph_feed_forward(attention_output, routing), None
        outputs = [self.experts[str(expert)](attention_output[start:end]) for expert, start, end in routing.segments]
        return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), None

    def graph_feed_forward(self, attention_output: torch.Tensor, routing: MoteRouting) -> torch.Tensor:
        """The graph-safe path: tensor ops only, every loaded expert in the graph. Where sizes may depend on the
        data (`row_counts`: `torch.export`), each expert runs on its run of the sorted rows, one `split` feeding
        them all; under `torch.compile`, whose shapes are static, each expert's rows are gathered and put back."""
        if routing.row_counts is not None:
            parts = attention_output.split(routing.row_counts)
            return torch.cat([expert(part) for expert, part in zip(self.experts.values(), parts, strict=True)])
        output = torch.zeros_like(attention_output)
        task_ids = routing.task_ids.to(attention_output.device)
        for key, expert in self.experts.items():
            rows = (task_ids == int(key)).nonzero().squeeze(-1)
            output = output.index_copy(0, rows, expert(attention_output.index_select(0, rows)))
        return output


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
        self.router = TaskRouter(self.config)  # the routing rule of every caller, built once (`task_router.py`)
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
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        return_dict: bool | None = None,
    ) -> MoteModelOutput | tuple:
        r"""
        task (`str` or `list[str]`, *optional*): Task of the whole batch, or one per row. Names from
            `config.tasks` or `config.task_aliases`.
        task_ids (`torch.LongTensor` of shape `(batch_size,)` or `int`, *optional*): Expert index per
            row (into `config.tasks`); -1 routes that row by its prefix. Used when `task` is not given.
        return_dict (`bool`, *optional*): `False` returns a tuple instead of a `MoteModelOutput`.

        Without either, each row's task is read from the instruction prefix its `input_ids` start
        with, then `config.default_task`; otherwise a `ValueError` lists the valid tasks (`task_router.py`).
        """
        batch = self.router.route_batch(
            input_ids,
            inputs_embeds,
            attention_mask,
            position_ids,
            task=task,
            task_ids=task_ids,
            position_offset=self.embeddings.position_offset,
            check_experts=self._check_experts_present,
        )
        input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds = batch.take(
            input_ids, batch.attention_mask, token_type_ids, batch.position_ids, inputs_embeds
        )
        backbone = self.forward_backbone(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            routing=batch.routing,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        output = MoteModelOutput(**batch.restore(backbone), task_ids=batch.task_ids)
        return output if return_dict is not False else output.to_tuple()

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
            where = next(module.parameters()).device
            if where != layer.attention.self.query.weight.device:
                raise ValueError(
                    f"The experts of task {task!r} are offloaded to {where}; call "
                    f"`model.set_active_tasks([..., {task!r}], offload_device=...)` to bring them back."
                )


__all__ = ["MoteBertModel", "MoteBertPreTrainedModel", "MoteBertLayer", "MoteBertExpert", "MoteModelOutput"]
