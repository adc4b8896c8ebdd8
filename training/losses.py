"""Losses for training expert models with sentence-transformers."""

from __future__ import annotations

import torch
from sentence_transformers.base.losses.merged_forward import column_merging_disabled
from torch import nn


class RouterAuxLoss(nn.Module):
    """Adds a token-routed MoE model's `aux_loss` (load balancing, z-loss) to a contrastive loss.

    The model's input module (`st_moe.MoeTransformer`) writes `aux_loss` into each input's
    features while the wrapped loss embeds them; this wrapper adds their mean. The coefficients
    live in the model config (`router_aux_loss_coef`, `router_z_loss_coef`), so the model output is
    already weighted.

    Example:

    ```python
    loss = RouterAuxLoss(MultipleNegativesRankingLoss(model))
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    # with Matryoshka dimensions, wrap outside so the aux loss is added once, not once per dimension
    loss = RouterAuxLoss(MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), [384, 128]))
    ```
    """

    def __init__(self, loss: nn.Module):
        super().__init__()
        self.loss = loss
        self.model = loss.model

    def forward(self, sentence_features: list[dict], labels: torch.Tensor | None = None) -> torch.Tensor:
        # Losses may merge columns (e.g. positives and hard negatives) into fresh dicts, where the
        # aux loss would be written out of our sight; keep them embedding the dicts we hold.
        with column_merging_disabled():
            value = self.loss(sentence_features, labels)
        aux = [features["aux_loss"] for features in sentence_features if "aux_loss" in features]
        if len(aux) != len(sentence_features):
            raise ValueError(
                f"RouterAuxLoss found `aux_loss` in {len(aux)} of {len(sentence_features)} inputs: the model's first "
                f"module must be st_moe.MoeTransformer and the wrapped loss ({type(self.loss).__name__}) must embed "
                "its inputs with the model directly (cached losses such as CachedMultipleNegativesRankingLoss "
                "embed copies and are not supported)"
            )
        return value + torch.stack(aux).mean()

    @property
    def citation(self) -> str:
        return (
            "@article{fedus2022switch, title={Switch Transformers: Scaling to Trillion Parameter Models with "
            "Simple and Efficient Sparsity}, author={Fedus, William and Zoph, Barret and Shazeer, Noam}, "
            "journal={JMLR}, year={2022}}"
        )
