"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer`, which tokenizes the prompt in front of the text as it does for any
model, plus the call's task: `encode(..., task="clustering")`, `encode_query`, `encode_document` and the
trainer's `router_mapping` name one, which travels to the model as a `task_ids` feature. Everything else is the
model's routing rule on the token ids (`task_router.py`): the prompt or the text's own task prefix, else the
default task, exactly as `AutoModel` and the exported graph route the same ids. Saved at the root of the model
folder and named in `modules.json` as `st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

import torch

from .st_compat import Transformer, init_kwargs, tokenize_texts


class MoteTransformer(Transformer):
    """`Transformer` whose rows reach the experts of a `MoteBertModel` by the model's routing rule: the call's
    `task`, else the task prefix the tokenized row starts with (the prompt's, else the text's own), else the
    folder's default task. The encoder reads what sentence-transformers tokenized, nothing added; a folder
    written with `--prefix-routes-only` reads it without its prefix (the model's `prefix_routes_only`)."""

    # `task` is a forward argument too, so that `get_model_kwargs()` tells callers the model is routed by task; it
    # names the same expert as the `task_ids` that `preprocess` adds
    forward_kwargs = {"task"}

    def __init__(self, *args, **kwargs):
        kwargs.pop("prepend_task_prefix", None)  # a setting of folders written before the rule moved to the model
        super().__init__(*args, **init_kwargs(kwargs))
        if not getattr(self.auto_model.config, "tasks", None):
            raise ValueError(
                f"MoteTransformer needs a MoTE model (config with `tasks`), got model_type "
                f"{self.auto_model.config.model_type!r}"
            )

    def with_task(self, features: dict, task, rows: int) -> dict:
        """`features` with the call's task as `task_ids` (-1 for every row when the call names none)."""
        if task is not None and not isinstance(task, str):
            raise ValueError(
                f"`task` takes one task name per call, got {type(task).__name__}; encode each task's texts "
                "separately (per-row tasks: call the model directly with `task=[...]`)"
            )
        explicit = self.auto_model.router.explicit(task, None, rows, "cpu")  # ValueError listing the valid tasks
        features["task_ids"] = explicit if explicit is not None else torch.full((rows,), -1, dtype=torch.long)
        return features

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """sentence-transformers' tokenization of the prompt and `inputs`, with the call's task as `task_ids`."""
        features = super().preprocess(inputs, prompt=prompt, task=task, **kwargs)
        return self.with_task(features, task, len(inputs))

    def tokenize(self, texts, padding: str | bool = True, task: str | None = None, **kwargs) -> dict:
        """`preprocess` for texts that already start with their prompt: what sentence-transformers 5.x sends."""
        return self.with_task(tokenize_texts(self, texts, padding=padding, **kwargs), task, len(texts))


__all__ = ["MoteTransformer"]
