"""Sentence-Transformers loss wrappers for this package's expert models.

`WithAuxLoss` adds the model's own auxiliary loss, the `aux_loss` of its output, to any
sentence-transformers loss: the token-routed MoE's load-balancing loss and router z-loss, or
CoMoE's contrastive expert loss plus its optional load-balancing loss. The model's input module
(`modeling/st_moe.py: MoeTransformer`) is what puts `aux_loss` in the features it sees.
"""

from __future__ import annotations

import torch
from sentence_transformers.base.losses.merged_forward import column_merging_disabled
from torch import nn


class WithAuxLoss(nn.Module):
    """A sentence-transformers loss plus the model's auxiliary loss (`aux_loss`), whatever it holds.

    The name says what the wrapped loss becomes: `WithAuxLoss(MultipleNegativesRankingLoss(model))`
    is that loss with the model's `aux_loss` added. It is named after the model output field it
    adds, not after one source of it, because the term differs by model type: a token-routed MoE
    (`moe_bert`) returns its load-balancing loss and router z-loss, CoMoE (`comoe_bert`) its
    contrastive expert loss (paper Algorithm 1) plus an optional load-balancing loss.

    The model's input module (`st_moe.MoeTransformer`) writes `aux_loss` into each input's
    features while the wrapped loss embeds them; this wrapper adds their mean. The coefficients
    live in the model config (`router_aux_loss_coef`, `router_z_loss_coef`, `contrastive_loss_coef`),
    so the model's `aux_loss` is already weighted.

    Example:

    ```python
    loss = WithAuxLoss(MultipleNegativesRankingLoss(model))
    trainer = SentenceTransformerTrainer(model=model, args=args, train_dataset=data, loss=loss)
    # with Matryoshka dimensions, wrap outside so the aux loss is added once, not once per dimension
    loss = WithAuxLoss(MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), [384, 128]))
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
                f"WithAuxLoss found `aux_loss` in {len(aux)} of {len(sentence_features)} inputs: the model's first "
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
            "journal={JMLR}, year={2022}}\n"
            "@article{feng2025comoe, title={CoMoE: Contrastive Representation for Mixture-of-Experts in "
            "Parameter-Efficient Fine-tuning}, author={Feng, Jinyuan and Wei, Chaopeng and Qiu, Tenghai and "
            "Hu, Tianyi and Pu, Zhiqiang}, year={2025}}"
        )
