"""Sentence-Transformers input module for models with an auxiliary training loss: the token-routed
MoE (load balancing, z-loss) and, through its subclass in `st_comoe.py`, CoMoE (contrastive expert loss,
optional load balancing).

sentence-transformers' `Transformer` plus one thing: the model's auxiliary loss is kept in the features
as `aux_loss`, so that a training loss can add it (see `moe_embed.training.losses.WithAuxLoss`). Saved at the root
of the model folder and named in `modules.json` as `st_moe.MoeTransformer`, so it needs
`trust_remote_code=True`.
"""

import threading

from .st_compat import Transformer, init_kwargs, output_name, tokenize_texts

# the tasks sentence-transformers itself names (`encode_query`, `encode_document`): its prompts and lengths
SENTENCE_TRANSFORMERS_TASKS = ("query", "document")


class MoeTransformer(Transformer):
    """`Transformer` that also returns the model's auxiliary loss as `features["aux_loss"]`. Its model routes each
    token by itself and has no task experts: a call that names another task than sentence-transformers' own is
    refused, never ignored."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **init_kwargs(kwargs))

    def check_task(self, task) -> None:
        if task is not None and task not in SENTENCE_TRANSFORMERS_TASKS:
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
        """`Transformer.forward` (its dispatch and keyword filtering unchanged), plus `aux_loss`.

        `Transformer.forward` keeps only the token embeddings of the model output, and calls the
        model's `forward` method directly (hooks on the model itself do not fire). The layer stack's
        auxiliary outputs (`layer_aux`: router logits, CoMoE's contrastive losses) are read from the
        output of the model's layer stack, a submodule, by a forward hook that lives for this call and
        only accepts calls made on this thread, so concurrent encodes cannot swap their losses; the
        model's own `aux_loss_from_layer_aux` then turns them into the loss.
        """
        model = self.auto_model
        caller = threading.get_ident()
        layer_aux = []

        def keep_layer_aux(module, args, output):
            if threading.get_ident() == caller and not layer_aux:
                layer_aux.append(output.layer_aux)

        handle = model.encoder.register_forward_hook(keep_layer_aux)
        try:
            features = super().forward(features, **kwargs)
        finally:
            handle.remove()
        if layer_aux:
            features["aux_loss"] = model.aux_loss_from_layer_aux(layer_aux[0], features[output_name(self)].device)
        return features


__all__ = ["MoeTransformer"]
