"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer` module plus task routing: the expert of each row comes
from the `task` argument (`encode(..., task="clustering")`, `encode_query`, `encode_document`, or
the trainer's `router_mapping`), else from the prompt (`encode(..., prompt_name="query")` puts the
prefix in front of the text) or from a prefix the raw text already starts with; the model reads
prefixes from the token ids. Saved at the root of the model folder and named in `modules.json` as
`st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

from .st_compat import LEGACY, Transformer, init_kwargs


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

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """Tokenize like `Transformer.preprocess`, the prompt chosen by `route_prompt`. The task itself reaches
        the model through the `task` forward argument (`encode`) or the `task` feature the trainer's collator
        sets."""
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
