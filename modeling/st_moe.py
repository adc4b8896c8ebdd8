"""Sentence-Transformers input module for token-routed MoE models.

sentence-transformers' `Transformer` plus one feature: the model's auxiliary loss (load balancing
and z-loss) is kept in the features as `aux_loss`, so that a training loss can add it (see
`training.losses.RouterAuxLoss`). Saved at the root of the model folder and named in
`modules.json` as `st_moe.MoeTransformer`, so it needs `trust_remote_code=True`.
"""

import threading

from sentence_transformers.models import Transformer


class MoeTransformer(Transformer):
    """`Transformer` that also returns the MoE model's auxiliary loss as `features["aux_loss"]`."""

    def forward(self, features: dict, **kwargs) -> dict:
        """`Transformer.forward` (its dispatch and keyword filtering unchanged), plus `aux_loss`.

        `Transformer.forward` keeps only the token embeddings of the model output, and calls the
        model's `forward` method directly (hooks on the model itself do not fire). The router logits
        are read from the output of the model's layer stack, a submodule, by a forward hook that
        lives for this call and only accepts calls made on this thread, so concurrent encodes cannot
        swap their losses; the loss is then the model's own `aux_loss` of those logits.
        """
        model = self.auto_model
        caller = threading.get_ident()
        router_logits = []

        def keep_router_logits(module, args, output):
            if threading.get_ident() == caller and not router_logits:
                router_logits.append(output.layer_aux)

        handle = model.encoder.register_forward_hook(keep_router_logits)
        try:
            features = super().forward(features, **kwargs)
        finally:
            handle.remove()
        if router_logits:
            features["aux_loss"] = model.aux_loss(router_logits[0], features[self.module_output_name].device)
        return features


__all__ = ["MoeTransformer"]
