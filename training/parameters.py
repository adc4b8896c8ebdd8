"""Which parameters of a model are its experts: what `trainable: experts` trains and what
`expert_learning_rate` applies to.

- MoTE (`mote_bert`): every task expert (`encoder.layer.N.experts.*`).
- token-routed MoE (`moe_bert`): the stacked experts and the routers (`mlp.experts.*`, `mlp.router.*`).
- CoMoE (`comoe_bert`) and peft LoRA: the adapters (LoRA experts, routers).
- a dense model of a base this package upcycles (`convert/bases.py`): the blocks MoTE turns into experts
  (attention-output LayerNorm or a pre-norm layer's feed-forward norm, the feed-forward block, the output LayerNorm)
  in the layers MoTE would give experts, so that an instruction-conditioned dense baseline trains exactly what
  MoTE's experts hold.
"""

from __future__ import annotations

from torch import nn

from moe_embed.convert.bases import BASE_OF
from moe_embed.convert.layout import mote_expert_key
from moe_embed.modeling.comoe_layer import is_adapter_key
from moe_embed.modeling.configuration_encoder import resolve_layer_indices


def expert_parameter_names(transformer: nn.Module, expert_layers="every_other") -> set[str]:
    """Names (as `transformer.named_parameters()` gives them) of the expert parameters; `expert_layers`
    picks the layers of a dense model (all, every_other or indices, as `moe-embed upcycle` reads them)."""
    names = [name for name, _ in transformer.named_parameters()]
    model_type = getattr(transformer.config, "model_type", None)
    if any("lora_" in name for name in names) and model_type not in ("comoe_bert",):  # peft LoRA
        return {name for name in names if "lora_" in name}
    if model_type == "mote_bert":
        return {name for name in names if ".experts." in name}
    if model_type == "moe_bert":
        return {name for name in names if ".mlp.experts." in name or ".mlp.router." in name}
    if model_type == "comoe_bert":
        return {name for name in names if is_adapter_key(name)}
    if model_type in BASE_OF:  # the dense model's names, read as the shared encoder's (`convert/bases.py`)
        layers = set(resolve_layer_indices(expert_layers, transformer.config.num_hidden_layers, "expert_layers"))
        our_key = BASE_OF[model_type].our_key
        return {name for name in names if (key := mote_expert_key(our_key(name)[0])) is not None and key[0] in layers}
    raise ValueError(f"no expert parameters are known for model_type {model_type!r}")


def train_only(transformer: nn.Module, names: set[str]) -> int:
    """Freeze every parameter not in `names` (those in it keep their `requires_grad`); returns how many
    parameters (elements) still train."""
    for name, parameter in transformer.named_parameters():
        if name not in names:
            parameter.requires_grad_(False)
    return sum(p.numel() for p in transformer.parameters() if p.requires_grad)


__all__ = ["expert_parameter_names", "train_only"]
