"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer` module plus task routing: the expert of each row comes
from the `task` argument (`encode(..., task="clustering")`, `encode_query`, `encode_document`, or
the trainer's `router_mapping`), else from the prompt (`encode(..., prompt_name="query")` puts the
prefix in front of the text) or from a prefix the raw text already starts with; the model reads
prefixes from the token ids. Saved at the root of the model folder and named in `modules.json` as
`st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

from sentence_transformers.models import Transformer

from .st_compat import LEGACY, init_kwargs


class MoteTransformer(Transformer):
    """`Transformer` whose `task` argument picks the expert of a `MoteBertModel`.

    When a task is given without a prompt, or with a prompt that is a task's prefix (such as the folder's
    default prompt), the named task's instruction prefix is put in front of each text (MoTE experts are
    trained on prefixed inputs); set `prepend_task_prefix=False` in `sentence_bert_config.json` to route
    without it. With no task named, the default prompt (the default task's prefix) goes only in front of texts
    that do not already start with a task prefix, so pre-prefixed texts keep their own expert.
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

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """Tokenize like `Transformer.preprocess`; a named task is validated and, without a prompt,
        its prefix is put in front of the texts. The task itself reaches the model through the
        `task` forward argument (`encode`) or the `task` feature the trainer's collator sets."""
        config = self.auto_model.config
        if task is not None:
            name = self.task_name(task)
            if prompt is None or prompt in config.task_prefixes.values():
                # No prompt, or a task's prefix (the model's default prompt, say): the named task's prefix.
                prompt = config.task_prefixes[name] if self.prepend_task_prefix else None
        else:
            default = config.task_prefixes.get(config.default_task) if config.default_task else None
            if prompt is not None and prompt == default:
                # The default prompt: a text that already starts with a task prefix keeps its own routing.
                prefixes = tuple(config.task_prefixes.values())
                inputs = [t if not isinstance(t, str) or t.startswith(prefixes) else prompt + t for t in inputs]
                prompt = None
        return super().preprocess(inputs, prompt=prompt, task=task, **kwargs)

    if LEGACY:  # sentence-transformers 5.x: encode() has put the prompt in the text

        def tokenize(self, texts, padding: str | bool = True, task: str | None = None, **kwargs):
            """The rules of `preprocess`, applied to texts that already start with their prompt: with a task
            named, a leading task prefix becomes the named task's; without, the default prompt is taken off
            a text that starts with another task prefix after it."""
            config = self.auto_model.config
            prefixes = sorted(config.task_prefixes.values(), key=len, reverse=True)
            default = config.task_prefixes.get(config.default_task) if config.default_task else None
            routed = []
            for text in texts:
                if isinstance(text, str) and task is not None:
                    lead = next((p for p in prefixes if text.startswith(p)), "")
                    text = (config.task_prefixes[self.task_name(task)] if self.prepend_task_prefix else "") + text[
                        len(lead) :
                    ]
                elif isinstance(text, str) and default and text.startswith(default):
                    if text[len(default) :].startswith(tuple(prefixes)):
                        text = text[len(default) :]
                routed.append(text)
            return super().tokenize(routed, padding=padding)


__all__ = ["MoteTransformer"]
