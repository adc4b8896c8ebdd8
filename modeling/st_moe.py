"""Sentence-Transformers input module for models with an auxiliary training loss: the token-routed
MoE (load balancing, z-loss) and, through its subclass in `st_comoe.py`, CoMoE (contrastive expert loss,
optional load balancing).

sentence-transformers' `Transformer` plus one thing: the model's auxiliary loss is kept in the features
as `aux_loss`, so that a training loss can add it (see `moe_embed.training.losses.WithAuxLoss`). Saved at the root
of the model folder and named in `modules.json` as `st_moe.MoeTransformer`, so it needs
`trust_remote_code=True`.
"""

import functools
import inspect

from .st_compat import Transformer, init_kwargs, output_name, tokenize_texts

# the tasks sentence-transformers itself names (`encode_query`, `encode_document`): its prompts and lengths
SENTENCE_TRANSFORMERS_TASKS = ("query", "document")


@functools.lru_cache(maxsize=16)
def forward_parameters(model_class: type) -> frozenset:
    """The arguments `model_class.forward` takes, read once per class (not once per batch)."""
    return frozenset(inspect.signature(model_class.forward).parameters)


class MoeTransformer(Transformer):
    """`Transformer` that also returns the model's auxiliary loss as `features["aux_loss"]`. Its model routes each
    token by itself and has no task experts: a call that names another task than sentence-transformers' own is
    refused, never ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **init_kwargs(kwargs))

    def check_task(self, task) -> None:
        if task is not None and str(task).casefold() not in SENTENCE_TRANSFORMERS_TASKS:
            raise ValueError(
                f"task={task!r}: this {self.auto_model.config.model_type} model routes each token itself and has no "
                f"task experts to pick; pass a prompt instead (prompt_name=..., or prompt='...'), or no task "
                f"(sentence-transformers' own {list(SENTENCE_TRANSFORMERS_TASKS)} are accepted)"
            )

    def preprocess(self, inputs, prompt: str | None = None, task: str | None = None, **kwargs) -> dict:
        self.check_task(task)
        return super().preprocess(inputs, prompt=prompt, task=task, **kwargs)

    def tokenize(self, texts, padding: str | bool = True, task: str | None = None, **kwargs) -> dict:
        """sentence-transformers 5.x's call."""
        self.check_task(task)
        return tokenize_texts(self, texts, padding=padding, **kwargs)

    def forward(self, features: dict, **kwargs) -> dict:
        """The model on the features its `forward` takes (keyword arguments override features, as in
        `Transformer.forward`); its token embeddings (and every layer's, with `output_hidden_states`) and its
        auxiliary loss go into the features, as the model returned them.

        `Transformer.forward` keeps only the token embeddings of the model's output, so this module calls the
        model itself: the model is a text encoder with one `forward`, so the call is the plain one, and the
        loss travels from the model's output to `features["aux_loss"]`, nowhere else."""
        model = self.auto_model
        # a peft-wrapped model (`arch: lora` training) takes `**kwargs` and hands them to the model it wraps
        accepted = forward_parameters(type(getattr(model, "get_base_model", lambda: model)()))
        inputs = {key: value for key, value in {**features, **kwargs}.items() if key in accepted}
        output = model(**inputs, return_dict=True)
        features[output_name(self)] = output.last_hidden_state
        if output.hidden_states is not None:
            features["all_layer_embeddings"] = output.hidden_states
        if output.aux_loss is not None:
            features["aux_loss"] = output.aux_loss
        return features


__all__ = ["MoeTransformer"]
