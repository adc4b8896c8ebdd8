"""Sentence-Transformers input module for MoTE models.

It is sentence-transformers' `Transformer` module plus task routing: the expert of each row comes
from the `task` argument (`encode(..., task="clustering")`, `encode_query`, `encode_document`, or
the trainer's `router_mapping`), else from the prompt (`encode(..., prompt_name="query")` puts the
prefix in front of the text) or from a prefix the raw text already starts with; the model reads
prefixes from the token ids. Saved at the root of the model folder and named in `modules.json` as
`st_mote.MoteTransformer`, so it needs `trust_remote_code=True`.
"""

import torch
from sentence_transformers.models import Transformer


class MoteTransformer(Transformer):
    """`Transformer` that turns a task name into per-row expert ids for a `MoteBertModel`.

    When a task is given without a prompt (`prompt=None`), the task's instruction prefix is put in front of each
    text (MoTE experts are trained on prefixed inputs); set `prepend_task_prefix=False` in
    `sentence_bert_config.json` to route without it.
    """

    forward_kwargs = {"task"}
    config_keys = Transformer.config_keys + ["prepend_task_prefix"]

    def __init__(self, *args, prepend_task_prefix: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.prepend_task_prefix = prepend_task_prefix
        tasks = getattr(self.auto_model.config, "tasks", None)
        if not tasks:
            raise ValueError(
                f"MoteTransformer needs a MoTE model (config with `tasks`), got model_type "
                f"{self.auto_model.config.model_type!r}"
            )

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        """Tokenize like `Transformer.preprocess` and add `task_ids` when a task is named."""
        config = self.auto_model.config
        task_id = None
        if task is not None:
            task_id = config.task_index(task)  # ValueError listing valid tasks for an unknown name
            if prompt is None and self.prepend_task_prefix:
                prompt = config.task_prefixes[config.tasks[task_id]]
        features = super().preprocess(inputs, prompt=prompt, task=task, **kwargs)
        if task_id is not None and "input_ids" in features:
            features["task_ids"] = torch.full((features["input_ids"].shape[0],), task_id, dtype=torch.long)
        return features


__all__ = ["MoteTransformer"]
