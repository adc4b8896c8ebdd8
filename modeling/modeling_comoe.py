"""CoMoE-PEFT (Feng et al., 2025, "CoMoE: Contrastive Representation for Mixture-of-Experts in
Parameter-Efficient Fine-tuning") on the shared encoder.

The base encoder is frozen; every target linear of every adapter layer is a `CoMoeLinear`
(`comoe_layer.py`: top-k routed LoRA experts, the contrastive expert loss, the merge maths). A
`CoMoeLayer` hands its linears the pass's routing and a fresh collector of their reports as the layer's
`routing` argument (the encoder passes it to each projection, `modeling_encoder.project`); the model turns the
reports into `aux_loss`, `router_logits` and `expert_counts`. Adapter-only folders (`comoe_adapter.py`) load
through `from_pretrained` and are written by `save_pretrained(adapter_only=True)`.

Saved model folders carry this file inlined into their code: it imports only torch, public transformers names
and its siblings.
"""

import math
import os
import re
from dataclasses import dataclass

import torch
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import cached_file

from .comoe_adapter import (
    HUB_KWARGS,
    adapter_state_dict,
    base_weights,
    check_base,
    check_settings,
    is_comoe_adapter,
    load_adapter_weights,
    read_adapter_config,
    resolve_base,
    save_adapter_folder,
)
from .comoe_layer import (
    ADAPTER_SUFFIXES,
    CoMoeLayerAux,
    CoMoeLinear,
    CoMoeRouter,
    CoMoeRouting,
    LayerRouting,
    is_adapter_key,
)
from .compat import init
from .configuration_comoe import CoMoeBertConfig
from .manifest import ADAPTER_WEIGHTS_NAME
from .modeling_encoder import EncoderLayer, EncoderPreTrainedModel
from .router_losses import load_balancing_loss


@dataclass
class CoMoeModelOutput(BaseModelOutputWithPooling):
    r"""
    Output of [`CoMoeBertModel`].

    aux_loss (`torch.FloatTensor` of shape `()`):
        `contrastive_loss_coef · contrastive_loss` (training only) `+ router_aux_loss_coef · load balancing`,
        the term to add to the training loss.
    contrastive_loss (`torch.FloatTensor` of shape `()`, *optional*):
        The contrastive expert loss averaged over tokens and CoMoE linears, unweighted; `None` unless
        training with `contrastive_loss_coef > 0`.
    router_logits (`tuple[torch.FloatTensor]`, *optional*, returned when `output_router_logits=True`):
        One `(num_tokens, num_local_experts)` fp32 tensor per CoMoE linear (order of
        `config.adapted_linears()`), over non-padding tokens in row-major order.
    expert_counts (`torch.LongTensor` of shape `(num_linears, num_local_experts)`):
        How many non-padding tokens each expert of each CoMoE linear received.
    """

    aux_loss: torch.FloatTensor | None = None
    contrastive_loss: torch.FloatTensor | None = None
    router_logits: tuple[torch.FloatTensor, ...] | None = None
    expert_counts: torch.LongTensor | None = None


class CoMoeLayer(EncoderLayer):
    """A BERT layer whose target linears are `CoMoeLinear`s; returns what they report as its aux output."""

    def __init__(self, config: CoMoeBertConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        for name in config.target_modules:
            parent_name, _, attribute = name.rpartition(".")
            parent = self.get_submodule(parent_name)
            dense = getattr(parent, attribute)
            linear = CoMoeLinear(dense.in_features, dense.out_features, config, bias=dense.bias is not None)
            setattr(parent, attribute, linear)

    def forward(self, hidden_states, attention_mask=None, routing=None, **kwargs):
        aux = CoMoeLayerAux()  # this pass's reports, handed with the routing to the layer's CoMoE linears
        output, weights, _ = super().forward(hidden_states, attention_mask, LayerRouting(routing, aux), **kwargs)
        return output, weights, aux


class CoMoeBertPreTrainedModel(EncoderPreTrainedModel):
    """Base class of CoMoE models: config class and initialisation of the adapters."""

    config_class = CoMoeBertConfig
    _no_split_modules = ["EncoderEmbeddings", "EncoderLayer", "CoMoeLayer"]
    # dense checkpoints saved by older transformers keep the position ids as a tensor
    _keys_to_ignore_on_load_unexpected = [r"(^|\.)position_ids$"]

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, CoMoeLinear):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
            if module.bias is not None:
                init.zeros_(module.bias)
            bound = 1.0 / math.sqrt(module.in_features)  # nn.Linear's (and peft's) init of lora_A
            init.uniform_(module.lora_A, -bound, bound)
            init.zeros_(module.lora_B)  # the model starts as the base model
        elif isinstance(module, CoMoeRouter):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)


class CoMoeBertModel(CoMoeBertPreTrainedModel):
    """Frozen BERT encoder with top-k routed LoRA experts on `config.target_modules` of `config.adapter_layers`.

    Only the adapters (`lora_A`, `lora_B`, `router.weight`) require gradients. `save_pretrained(DIR)`
    writes the whole model; `save_pretrained(DIR, adapter_only=True)` the adapters alone, with
    `adapter_config.json` naming the base model, which `from_pretrained(DIR)` then loads.

    Example:

    ```python
    >>> model = AutoModel.from_pretrained("models/comoe-minilm", trust_remote_code=True)
    >>> out = model(**tokenizer(["who was newton?"], return_tensors="pt"), output_router_logits=True)
    >>> out.last_hidden_state, out.aux_loss, out.expert_counts
    ```
    """

    def __init__(self, config: CoMoeBertConfig, adapters_load_later: bool = False):
        r"""
        adapters_load_later (`bool`, *optional*): The weights `from_pretrained` is about to load are a base
            model's (the base of an adapter-only folder), whose lack of adapter tensors is expected rather than
            reported: they are read next, from the adapter file.
        """
        super().__init__(config)
        if adapters_load_later:
            self._keys_to_ignore_on_load_missing = [rf"{re.escape(suffix)}$" for suffix in ADAPTER_SUFFIXES]
        self.build_encoder(CoMoeLayer, config.adapter_layers)
        self.post_init()
        self.freeze_base()

    def freeze_base(self) -> None:
        """Only the adapters require gradients (called again after loading: loading replaces parameters)."""
        for name, parameter in self.named_parameters():
            parameter.requires_grad_(is_adapter_key(name))

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.LongTensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        output_attentions: bool | None = None,
        output_router_logits: bool | None = None,
        return_dict: bool | None = None,
    ) -> CoMoeModelOutput | tuple:
        r"""
        output_router_logits (`bool`, *optional*): Return every router's logits (defaults to
            `config.output_router_logits`).
        return_dict (`bool`, *optional*): `False` returns a tuple instead of a `CoMoeModelOutput`.
        """
        attention_mask, token_index = self.real_token_index(input_ids, inputs_embeds, attention_mask)
        routing = CoMoeRouting(token_index, contrastive=self.training and self.config.contrastive_loss_coef > 0)
        backbone = self.forward_backbone(
            input_ids,
            attention_mask,
            token_type_ids,
            position_ids,
            inputs_embeds,
            routing=routing,
            output_hidden_states=output_hidden_states,
            output_attentions=output_attentions,
        )
        device = backbone.last_hidden_state.device
        layer_aux = backbone.layer_aux
        contrastive = self.contrastive_loss(layer_aux, device)
        if output_router_logits is None:
            output_router_logits = self.config.output_router_logits
        output = CoMoeModelOutput(
            last_hidden_state=backbone.last_hidden_state,
            pooler_output=backbone.pooler_output,
            hidden_states=backbone.hidden_states,
            attentions=backbone.attentions,
            aux_loss=self._weighted_aux_loss(contrastive, layer_aux, device),
            contrastive_loss=contrastive,
            router_logits=tuple(x for aux in layer_aux for x in aux.router_logits) if output_router_logits else None,
            expert_counts=torch.stack([c.to(device) for aux in layer_aux for c in aux.expert_counts]),
        )
        return output if return_dict is not False else output.to_tuple()

    @staticmethod
    def contrastive_loss(layer_aux: tuple[CoMoeLayerAux, ...], device: torch.device) -> torch.Tensor | None:
        """The contrastive expert loss averaged over the CoMoE linears, or `None` where none was computed."""
        losses = [loss.to(device) for aux in layer_aux for loss in aux.contrastive_losses]
        return torch.stack(losses).mean() if losses else None

    def _weighted_aux_loss(self, contrastive: torch.Tensor | None, layer_aux, device) -> torch.Tensor:
        """The output's `aux_loss`, on `device`: `contrastive_loss_coef · contrastive loss + router_aux_loss_coef ·
        load balancing` over the layers' reports (`layer_aux`), the term a training loss adds."""
        config = self.config
        total = torch.zeros((), device=device)
        if contrastive is not None:
            total = total + config.contrastive_loss_coef * contrastive
        if config.router_aux_loss_coef:
            balance = [
                load_balancing_loss(logits, config.num_experts_per_tok).to(device)
                for aux in layer_aux
                for logits in aux.router_logits
            ]
            total = total + config.router_aux_loss_coef * torch.stack(balance).mean()
        return total

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The adapters' tensors (LoRA experts and routers), by parameter name."""
        return adapter_state_dict(self)

    def num_parameters_by_kind(self) -> tuple[int, int]:
        """`(trainable, total)` parameter counts."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return trainable, sum(p.numel() for p in self.parameters())

    def merged_state_dict(self, expert_weights: torch.Tensor) -> dict[str, torch.Tensor]:
        """The dense model's state dict: every CoMoE linear's weight with its experts folded in
        (`CoMoeLinear.merged_weight`), `expert_weights[l]` the weights of linear `l`'s experts (order of
        `config.adapted_linears()`); routers and experts dropped."""
        state = {name: value for name, value in self.state_dict().items() if not is_adapter_key(name)}
        for row, name in enumerate(self.config.adapted_linears()):
            state[f"{name}.weight"] = self.get_submodule(name).merged_weight(expert_weights[row])
        return state

    def save_pretrained(self, save_directory, *args, adapter_only: bool = False, base_model_name_or_path=None, **kw):
        """`PreTrainedModel.save_pretrained`, or with `adapter_only=True` the adapters alone (a few MB):
        `config.json` and the model code, `adapter_config.json` naming the base model
        (`base_model_name_or_path`, default `config.base_model_name_or_path`; a local folder is named by its
        path relative to the adapter folder), `adapter_model.safetensors` and the Sentence-Transformers files."""
        if not adapter_only:
            return super().save_pretrained(save_directory, *args, **kw)
        base = base_model_name_or_path or self.config.base_model_name_or_path
        if not base:
            raise ValueError(
                "an adapter-only folder must name its base model: pass base_model_name_or_path= "
                "(a Hub id or a local folder of the dense model)"
            )
        save_adapter_folder(self, save_directory, base)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, base_model_name_or_path=None, **kwargs):
        """`PreTrainedModel.from_pretrained`; an adapter-only folder (a CoMoE `adapter_config.json`) loads the
        base model it names (or `base_model_name_or_path`), checked against the adapter's shapes before any
        weight is read, then the adapters."""
        hub_kwargs = {key: kwargs[key] for key in HUB_KWARGS if key in kwargs}
        settings = read_adapter_config(pretrained_model_name_or_path, **hub_kwargs)
        if not is_comoe_adapter(settings):
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_base()
            return loaded
        where = f"{pretrained_model_name_or_path}/adapter_config.json"
        config = kwargs.pop("config", None)
        given = getattr(config, "base_model_name_or_path", None)  # a config of this folder's own code, or another copy
        if given and given != settings.get("base_model_name_or_path"):
            # `AutoModel.from_pretrained(..., base_model_name_or_path=X)`: `AutoConfig` took the argument as the
            # config's attribute; it is the caller's, meant for this load
            base_model_name_or_path = base_model_name_or_path or given
        if not isinstance(config, CoMoeBertConfig):
            config = cls.config_class.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        kwargs.pop("adapter_kwargs", None)  # transformers' peft integration: this adapter is loaded below
        want_info = kwargs.pop("output_loading_info", False)
        check_settings(settings, config, where)
        named = os.fspath(base_model_name_or_path or settings.get("base_model_name_or_path"))
        base = resolve_base(named, pretrained_model_name_or_path, where)
        base_kwargs = {k: v for k, v in kwargs.items() if k not in ("revision", "subfolder")}  # they locate the adapter
        base_hub_kwargs = {k: v for k, v in hub_kwargs.items() if k in base_kwargs}
        source, base_type = check_base(config, base, where, base_hub_kwargs)
        state = base_weights(source, base_type, base_hub_kwargs)  # a base named otherwise: renamed (MPNet, ...)
        model, info = super().from_pretrained(
            None if state is not None else source,
            *model_args,
            config=config,
            state_dict=state,
            output_loading_info=True,
            adapters_load_later=True,
            **base_kwargs,
        )
        missing = sorted(info["missing_keys"])
        if missing:
            raise ValueError(f"the base model {base!r} lacks weights the adapter needs: {missing[:5]}")
        load_adapter_weights(model, cached_file(pretrained_model_name_or_path, ADAPTER_WEIGHTS_NAME, **hub_kwargs))
        # as resolved here (a Hub id stays one, where an installed copy served it): a later save names it from its
        # own folder
        model.config.base_model_name_or_path = base
        model.freeze_base()
        return (model, info) if want_info else model


__all__ = ["CoMoeBertModel", "CoMoeBertPreTrainedModel", "CoMoeLayer", "CoMoeModelOutput"]
