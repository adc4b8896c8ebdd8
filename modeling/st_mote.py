"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer` plus task routing. The module knows each row's task before it
tokenizes: the `task` of the call (`encode(..., task="clustering")`, `encode_query`, `encode_document`, the
trainer's `router_mapping`), else the prompt's task (`encode(..., prompt_name="query")` gives the query
prefix as the prompt), else the task prefix the text itself starts with, else the folder's default task. It
sends that task to the model as a `task_ids` feature, so nothing downstream detects it again; the model
reads prefixes from token ids only for callers that send raw `input_ids`. Saved at the root of the model
folder and named in `modules.json` as `st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

import torch

# transformers 4.x copies only the direct relative imports of a module file into its module cache, so every
# sibling this file needs, directly or not, is imported here by name.
from .compat import is_exporting  # noqa: F401
from .configuration_encoder import EncoderConfig  # noqa: F401
from .configuration_mote import MoteBertConfig  # noqa: F401
from .defaults import DEFAULT_TASK  # noqa: F401
from .modeling_encoder import EncoderLayer  # noqa: F401
from .modeling_mote import route_rows
from .st_compat import Transformer, init_kwargs, tokenize_texts


class MoteTransformer(Transformer):
    """`Transformer` whose rows are routed to the experts of a `MoteBertModel` by task.

    The task of a row, first that applies: the `task` of the call; the prompt's task (a prompt that is a task's
    prefix; the default task's prefix does not override a text's own prefix); the task prefix the text starts
    with; the folder's default task (`config.default_task`). With none (a folder without a default task) the
    model raises an error that lists the tasks.

    What the encoder reads: by default the row's task prefix and the text (MoTE experts are trained on prefixed
    inputs, the paper's choice): the prefix is put in front of a text that does not start with one, a prompt that
    is not a task prefix is kept as it is, and an empty prompt (`prompt=""`) adds nothing. With
    `prepend_task_prefix=False` (in `sentence_bert_config.json`, written by `moe-embed upcycle
    --prefix-routes-only`) a task prefix only picks the expert and the encoder never sees it: the text's own
    prefix is taken off and only a prompt that is not a task prefix is put in front. An upcycled, untrained
    model then computes the dense model's embedding of the plain text for every task.
    """

    # `task` is a forward argument too, so that `get_model_kwargs()` tells callers the model is routed by task; it
    # names the same expert as the `task_ids` that `preprocess` resolved
    forward_kwargs = {"task"}
    config_keys = Transformer.config_keys + ["prepend_task_prefix"]

    def __init__(self, *args, prepend_task_prefix: bool = True, **kwargs):
        super().__init__(*args, **init_kwargs(kwargs))
        self.prepend_task_prefix = prepend_task_prefix
        if not getattr(self.auto_model.config, "tasks", None):
            raise ValueError(
                f"MoteTransformer needs a MoTE model (config with `tasks`), got model_type "
                f"{self.auto_model.config.model_type!r}"
            )

    def task_name(self, task) -> str:
        """The task (canonical name) of an `encode(..., task=...)` call; `ValueError` for a list or an unknown name."""
        if not isinstance(task, str):
            raise ValueError(
                f"`task` takes one task name per call, got {type(task).__name__}; encode each task's texts "
                "separately (per-row tasks: call the model directly with `task=[...]`)"
            )
        config = self.auto_model.config
        return config.tasks[config.task_index(task)]  # ValueError listing valid tasks for an unknown name

    def route(self, text, prompt: str | None, task: str | None) -> tuple[object, list[int]]:
        """`(what the encoder reads, candidate experts)` of one row: the candidates are the call's task, the
        prompt's task and the text's own prefix's task, each -1 where there is none, in order of precedence
        (`route_rows` picks the first, else the default task)."""
        config = self.auto_model.config
        if not isinstance(text, str):  # not text (a pair, an image): the model routes it
            return text, [-1, -1, -1]
        named = self.task_name(task) if task is not None else None
        default_prefix = config.task_prefixes.get(config.default_task) if config.default_task else None
        prompt_task = config.task_of_prefix(prompt) if prompt else None
        own_task, body = config.split_task_prefix(text)
        custom = prompt is not None and prompt_task is None  # a prompt that is not a task prefix ("" included)
        candidates = [
            config.tasks.index(named) if named else -1,
            config.tasks.index(prompt_task) if prompt_task and prompt != default_prefix else -1,
            config.tasks.index(own_task) if own_task else -1,
        ]
        if not self.prepend_task_prefix:  # the prefix only routes: the text's own is taken off
            return (prompt if custom else "") + body, candidates
        if named:
            lead = prompt if custom else config.task_prefixes[named]
        elif prompt is None or prompt == default_prefix:  # the default task's prefix, unless the text has its own
            lead = None if own_task else default_prefix
        else:
            lead = prompt
        return (lead or "") + text, candidates

    def split_prompt(self, text) -> tuple[str | None, object]:
        """`(prompt, text)` of a text whose prompt is already in front of it (sentence-transformers 5.x puts it
        there): the task prefix it starts with, else no prompt."""
        if not isinstance(text, str):
            return None, text
        task, rest = self.auto_model.config.split_task_prefix(text)
        return (self.auto_model.config.task_prefixes[task], rest) if task else (None, text)

    def _routed_features(self, rows: list[tuple[str | None, object]], task: str | None, **kwargs) -> dict:
        """Tokenize each `(prompt, text)` row as the encoder must read it, with its expert as `task_ids`."""
        config = self.auto_model.config
        routed = [self.route(text, prompt, task) for prompt, text in rows]
        features = tokenize_texts(self, [text for text, _ in routed], task=task, **kwargs)
        candidates = torch.tensor([ids for _, ids in routed], dtype=torch.long).reshape(len(routed), 3)
        task_ids = route_rows(*candidates.unbind(dim=1), default=config.default_task_index)
        not_text = torch.tensor([not isinstance(text, str) for _, text in rows], dtype=torch.bool)
        features["task_ids"] = task_ids.masked_fill(not_text, -1)  # the model reads their prefix, if any
        return features

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """Tokenize `inputs` as the encoder must read them (see the class docstring), their experts as `task_ids`."""
        return self._routed_features([(prompt, text) for text in inputs], task, **kwargs)

    def tokenize(self, texts, padding: str | bool = True, task: str | None = None, **kwargs) -> dict:
        """`preprocess` for texts that already start with their prompt: what sentence-transformers 5.x sends."""
        return self._routed_features([self.split_prompt(text) for text in texts], task, padding=padding, **kwargs)


__all__ = ["MoteTransformer"]
