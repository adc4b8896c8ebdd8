"""Sentence-Transformers input module for token-routed MoE models.

sentence-transformers' `Transformer` plus one feature: the model's `aux_loss` (load balancing and
z-loss) is kept in the features, so that a training loss can add it (see
`training.losses.RouterAuxLoss`). Saved at the root of the model folder and named in
`modules.json` as `st_moe.MoeTransformer`, so it needs `trust_remote_code=True`.
"""

from sentence_transformers.models import Transformer


class MoeTransformer(Transformer):
    """`Transformer` that also returns the MoE model's auxiliary loss as `features["aux_loss"]`."""

    def forward(self, features: dict, **kwargs) -> dict:
        """Token embeddings as `Transformer.forward` computes them, plus `aux_loss`."""
        inputs = {k: features[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in features}
        output = self.auto_model(**inputs, **kwargs)
        features[self.module_output_name] = output.last_hidden_state
        features["aux_loss"] = output.aux_loss
        if self.auto_model.config.output_hidden_states:
            features["all_layer_embeddings"] = output.hidden_states
        return features


__all__ = ["MoeTransformer"]
