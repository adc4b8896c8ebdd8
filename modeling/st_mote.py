"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer` module plus task routing: the expert of each row comes
from the `task` argument (`encode(..., task="clustering")`, `encode_query`, `encode_document`, or
the trainer's `router_mapping`), else from the prompt (`encode(..., prompt_name="query")` puts the
prefix in front of the text) or from a prefix the raw text already starts with; the model reads
prefixes from the token ids. Saved at the root of the model folder and named in `modules.json` as
`st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

import torch

from .st_compat import LEGACY, Transformer, init_kwargs


class MoteTransformer(Transformer):
    """`Transformer` whose `task` argument picks the expert of a `MoteBertModel`.

    When a task is given without a prompt, or with a prompt that is a task's prefix (such as the folder's
    default prompt), the named task's instruction prefix is put in front of each text (MoTE experts are
    trained on prefixed inputs, the paper's choice). With no task named, the default prompt (the default task's
    prefix) goes only in front of texts that do not already start with a task prefix, so pre-prefixed texts
    keep their own expert.

    With `prepend_task_prefix=False` (in `sentence_bert_config.json`) a task prefix only picks the expert and
    the encoder never sees it: the task comes from `task`, else from a prompt that is a task's prefix, else
    from a prefix the text starts with (which is removed), else the default task; other prompts stay text.
    An upcycled, untrained model then computes the dense model's embedding of the plain text for every task.
    """

    forward_kwargs = {"task"}
    config_keys = Transformer.config_keys + ["prepend_task_prefix"]

    def __init__(self, *args, prepend_task_prefix: bool = True, **kwargs):
        super().__init__(*args, **init_kwargs(kwargs))
        self.prepend_task_prefix = prepend_task_prefix
        tasks = getattr(self.auto_model.config, "tasks", None)
        if not tasks:
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

    def route_prompt(self, prompt: str | None, text: str, task: str | None) -> str | None:
        """The prompt to put in front of `text`. With a task named, a missing prompt or one that is some task's
        prefix (the folder's default prompt, say) becomes the named task's prefix, so that expert and prefix
        agree (`None` when `prepend_task_prefix` is off); with no task, the default prompt is not put in front
        of a text that already starts with a task prefix, so that it keeps its own expert."""
        config = self.auto_model.config
        prefixes = tuple(config.task_prefixes.values())
        if task is not None:
            if prompt is None or prompt in prefixes:
                return config.task_prefixes[self.task_name(task)] if self.prepend_task_prefix else None
            return prompt
        default = config.task_prefixes.get(config.default_task) if config.default_task else None
        return None if prompt is not None and prompt == default and text.startswith(prefixes) else prompt

    @staticmethod
    def split_prefix(text: str, prefixes: list[tuple[str, str]]) -> tuple[str | None, str]:
        """`(task, rest)` for a text that starts with one of `prefixes` (`(task, prefix)`, longest first), else
        `(None, text)`."""
        for name, prefix in prefixes:
            if text.startswith(prefix):
                return name, text[len(prefix) :]
        return None, text

    def route_without_prefix(self, texts: list, prompt: str | None, task: str | None) -> tuple[list, str | None, list]:
        """`(texts, prompt, task ids)` with every task prefix taken off and turned into the row's expert
        (`prepend_task_prefix=False`); -1 leaves the row to the default task."""
        config = self.auto_model.config
        prefixes = sorted(config.task_prefixes.items(), key=lambda item: -len(item[1]))
        prompt_task, rest = self.split_prefix(prompt, prefixes) if prompt else (None, prompt)
        if prompt_task is not None and rest:  # a prompt that merely starts like a prefix is text
            prompt_task = None
        is_default = prompt_task is not None and prompt_task == config.default_task
        stripped, ids = [], []
        for text in texts:
            row_task, body = self.split_prefix(text, prefixes) if isinstance(text, str) else (None, text)
            chosen = task or (row_task if is_default and row_task else prompt_task) or row_task
            stripped.append(body)
            ids.append(config.task_index(chosen) if chosen else -1)
        return stripped, (None if prompt_task is not None else prompt), ids

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """Tokenize like `Transformer.preprocess`, the prompt chosen by `route_prompt`. The task itself reaches
        the model through the `task` forward argument (`encode`) or the `task` feature the trainer's collator
        sets; with `prepend_task_prefix=False` through a `task_ids` feature instead of prefix tokens."""
        if not self.prepend_task_prefix:
            inputs, prompt, ids = self.route_without_prefix(list(inputs), prompt, task)
            features = super().preprocess(inputs, prompt=prompt, task=task, **kwargs)
            features["task_ids"] = torch.tensor(ids, dtype=torch.long)
            return features
        if task is not None:  # one prompt for the whole call
            prompt = self.route_prompt(prompt, "", task)
        elif prompt is not None:
            prompts = [self.route_prompt(prompt, t, None) if isinstance(t, str) else prompt for t in inputs]
            if any(p != prompt for p in prompts):  # it differs per text: put each in front here
                inputs = [(p or "") + t if isinstance(t, str) else t for p, t in zip(prompts, inputs, strict=True)]
                prompt = None
        return super().preprocess(inputs, prompt=prompt, task=task, **kwargs)

    if LEGACY:  # sentence-transformers 5.x: encode() has put the prompt in the text

        def tokenize(self, texts, padding: str | bool = True, task: str | None = None, **kwargs):
            """`route_prompt` on texts that already start with their prompt: a leading task prefix is taken
            for the prompt."""
            if not self.prepend_task_prefix:
                texts, _, ids = self.route_without_prefix(list(texts), None, task)
                features = super().tokenize(texts, padding=padding)
                features["task_ids"] = torch.tensor(ids, dtype=torch.long)
                return features
            prefixes = sorted(self.auto_model.config.task_prefixes.values(), key=len, reverse=True)
            routed = []
            for text in texts:
                if isinstance(text, str):
                    lead = next((p for p in prefixes if text.startswith(p)), None)
                    body = text[len(lead) :] if lead else text
                    text = (self.route_prompt(lead, body, task) or "") + body
                routed.append(text)
            return super().tokenize(routed, padding=padding)


__all__ = ["MoteTransformer"]
