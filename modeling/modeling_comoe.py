"""CoMoE-PEFT (Feng et al., 2025, "CoMoE: Contrastive Representation for Mixture-of-Experts in
Parameter-Efficient Fine-tuning") on the shared encoder.

The base encoder is frozen. Every target linear of every adapter layer becomes a `CoMoeLinear`:
the base `weight` and `bias` (same names as `nn.Linear`, so dense checkpoints load unchanged),
`num_local_experts` LoRA experts stored stacked (`lora_A` `(E, r, in)`, `lora_B` `(E, out, r)`) and
a router `(E, in)` computed in fp32. Each non-padding token goes to its top-k experts with the
router's softmax renormalised over them (paper eq. 3):

    y = W x + b + Σ_{i ∈ top-k(x)} g_i(x) · (alpha / r) · B_i A_i x

The forward is two matmuls whatever the routing: every expert's rank-r code `A_i x` at once
(`(tokens, E·r)`), then the gated codes times the stacked `B`, added into the base output. In
training with λ > 0 every pair of experts is compared as well, for the contrastive expert loss
(Algorithm 1, `expert_similarities`, `contrastive_expert_loss`).

Which tokens are padding, and where the linears report their router logits and losses, reach the
linears through a context variable set by `CoMoeLayer.forward` for the duration of one layer's
forward pass: nothing is stored on a module, so concurrent forward passes on several threads do
not mix, and gradient checkpointing (which re-runs the layer's forward) sees the same context.

This file is copied into saved model folders: it imports only torch, public transformers names and
its siblings.
"""

import contextvars
import copy
import json
import logging
import math
import os
import re
import shutil
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.dynamic_module_utils import custom_object_save
from transformers.modeling_outputs import BaseModelOutputWithPooling
from transformers.utils import cached_file

from .compat import init
from .configuration_comoe import CoMoeBertConfig
from .configuration_encoder import EncoderConfig  # noqa: F401 (transformers 4.x: see modeling_mote.py)
from .configuration_moe import MoeBertConfig  # noqa: F401
from .manifest import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_PEFT_TYPE,
    ADAPTER_WEIGHTS_NAME,
    FOLDER_FILES,
    LIBRARY_NAME,
    ST_MODULES,
    TOKENIZER_FILES,
)
from .modeling_encoder import EncoderLayer, EncoderPreTrainedModel
from .modeling_moe import load_balancing_loss

logger = logging.getLogger(__name__)

ADAPTER_KEY_PREFIX = "base_model.model."  # peft's prefix of adapter tensor names
ADAPTER_SUFFIXES = (".lora_A", ".lora_B", ".router.weight")
# config fields that must agree between an adapter and the base it is loaded on
BASE_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
_HUB_KWARGS = ("cache_dir", "force_download", "local_files_only", "token", "revision", "subfolder", "proxies")


def is_adapter_key(name: str) -> bool:
    """Whether a parameter name belongs to the adapters (LoRA experts or routers), not the frozen base."""
    return name.endswith(ADAPTER_SUFFIXES)


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


@dataclass(frozen=True)
class CoMoeRouting:
    """Decided once per forward pass: the flat indices of non-padding tokens (`None`: no padding) and
    whether the linears compute the contrastive expert loss."""

    token_index: torch.LongTensor | None
    contrastive: bool = False


@dataclass
class CoMoeLayerAux:
    """What the CoMoE linears of one layer report during one forward pass, in call order."""

    router_logits: list = field(default_factory=list)
    contrastive_losses: list = field(default_factory=list)
    expert_counts: list = field(default_factory=list)


@dataclass(frozen=True)
class _LayerContext:
    routing: CoMoeRouting | None
    aux: CoMoeLayerAux


_LAYER_CONTEXT: contextvars.ContextVar = contextvars.ContextVar("comoe_layer_context", default=None)


def cosine_from_gram(gram: torch.Tensor) -> torch.Tensor:
    """Cosines `G_ij / sqrt((G_ii + 1e-12)(G_jj + 1e-12))` from Gram matrices `(..., n, n)`: those of
    the unit vectors `v / sqrt(|v|² + 1e-12)`, so 0 (with a finite gradient) for a zero vector."""
    norms = torch.rsqrt(torch.diagonal(gram, dim1=-2, dim2=-1).clamp_min(0) + 1e-12)
    return gram * norms.unsqueeze(-1) * norms.unsqueeze(-2)


def expert_similarities(codes: torch.Tensor, lora_b: torch.Tensor) -> torch.Tensor:
    """`(tokens, E, E)`: for each pair of experts, the mean of the cosine of their rank-r codes `A_i x`
    and the cosine of their outputs `B_i A_i x`: the similarity the contrastive loss compares.

    It equals the dot product of the vectors `[unit(A_i x), unit(B_i A_i x)] / √2`. With `B = 0`
    (upcycled) every output is zero, the outputs' cosine is 0 with no gradient, and the codes (A is
    random) carry the loss from step 0; as the B_i move away from 0 the outputs' half becomes the
    paper's comparison of expert outputs (see docs/architecture.md). The outputs' dot products come
    from the Gram matrix of the stacked B (`c_i^T B_i^T B_j c_j`), so the `(tokens, E, out)` outputs
    are never formed: a few hundred numbers per token instead of `E · out`.

    Args:
        codes: `(tokens, E, r)` every expert's code.
        lora_b: `(E, out, r)` the stacked B.
    """
    codes = codes.float()
    num_experts, out_features, rank = lora_b.shape
    flat_b = lora_b.float().transpose(0, 1).reshape(out_features, num_experts * rank)
    b_gram = (flat_b.T @ flat_b).view(num_experts, rank, num_experts, rank)  # B_i^T B_j blocks
    output_gram = torch.einsum("tjb,iajb,tia->tij", codes, b_gram, codes)
    code_gram = codes @ codes.transpose(1, 2)
    return 0.5 * (cosine_from_gram(code_gram) + cosine_from_gram(output_gram))


def contrastive_expert_loss(
    similarities: torch.Tensor, top_k_index: torch.Tensor, anchor_slot: torch.Tensor, tau: float, eps: float
) -> torch.Tensor:
    """The contrastive expert loss (paper, Algorithm 1) averaged over tokens.

    For token t the anchor is the expert `top_k_index[t, anchor_slot[t]]`, the positives are its other
    activated experts and the negatives the inactivated ones; with `s` the anchor's similarities to
    them divided by `tau`, the loss is `-log(Σ exp(s_pos) / (Σ exp([s_pos, s_neg]) + eps))`.

    Args:
        similarities: `(tokens, E, E)` cosine similarities between experts (`expert_similarities`).
        top_k_index: `(tokens, k)` activated experts, `k >= 2`.
        anchor_slot: `(tokens,)` position in `0..k-1` of each token's anchor.
    """
    num_tokens, num_experts, _ = similarities.shape
    if num_tokens == 0:
        return similarities.sum() * 0.0
    anchor = top_k_index.gather(1, anchor_slot.unsqueeze(1))  # (tokens, 1)
    scores = similarities.gather(1, anchor.unsqueeze(-1).expand(-1, -1, num_experts)).squeeze(1) / tau
    others = torch.ones_like(scores, dtype=torch.bool).scatter(1, anchor, False)
    positive = torch.zeros_like(others).scatter(1, top_k_index, True) & others
    log_positive = torch.logsumexp(scores.masked_fill(~positive, float("-inf")), dim=1)
    log_all = torch.logsumexp(scores.masked_fill(~others, float("-inf")), dim=1)
    # log(Σ exp(s) + ε) computed without overflow
    loss = log_all + torch.log1p(eps * torch.exp(-log_all)) - log_positive
    return loss.mean()


def top_k_gates(router_logits: torch.Tensor, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`(weights, index)` of the top-k experts per token: the router's softmax, renormalised over the
    chosen experts to sum to 1 (paper eq. 3), computed as the softmax of the k largest logits (the same
    numbers, without a softmax over all experts). `router_logits` is `(tokens, E)`."""
    logits, index = torch.topk(router_logits, top_k, dim=-1)
    return torch.softmax(logits, dim=-1), index


class CoMoeRouter(nn.Module):
    """`Linear(in_features, num_experts, bias=False)`, computed in fp32 even under autocast."""

    def __init__(self, in_features: int, num_experts: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, in_features))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=hidden_states.device.type, enabled=False):
            return nn.functional.linear(hidden_states.float(), self.weight.float())


class CoMoeLinear(nn.Module):
    """A frozen linear (`weight`, `bias`) plus top-k routed LoRA experts (`lora_A`, `lora_B`, `router`)."""

    def __init__(self, in_features: int, out_features: int, config: CoMoeBertConfig):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.num_experts, self.top_k, self.rank = config.num_local_experts, config.num_experts_per_tok, config.lora_rank
        self.scaling = config.lora_scaling
        self.tau, self.eps = config.contrastive_tau, config.contrastive_eps
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.lora_A = nn.Parameter(torch.empty(self.num_experts, self.rank, in_features))
        self.lora_B = nn.Parameter(torch.empty(self.num_experts, out_features, self.rank))
        self.router = CoMoeRouter(in_features, self.num_experts)
        self.lora_dropout = nn.Dropout(config.lora_dropout)

    def route(self, tokens: torch.Tensor):
        """`(logits, weights, index)` for `(tokens, in)`: fp32 logits, top-k weights renormalised to sum to 1."""
        logits = self.router(tokens)
        return (logits, *top_k_gates(logits, self.top_k))

    def expert_codes(self, tokens: torch.Tensor) -> torch.Tensor:
        """Every expert's rank-r code `A_i x` (dropout in training), `(tokens, E, r)`, in one matmul."""
        flat_a = self.lora_A.reshape(self.num_experts * self.rank, self.in_features)
        return nn.functional.linear(self.lora_dropout(tokens), flat_a).view(-1, self.num_experts, self.rank)

    def expert_outputs(self, codes: torch.Tensor) -> torch.Tensor:
        """Every expert's scaled output `(alpha / r) · B_i A_i x`, `(tokens, E, out)`."""
        return torch.einsum("ter,eor->teo", codes, self.lora_B) * self.scaling

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output = nn.functional.linear(hidden_states, self.weight, self.bias)
        context = _LAYER_CONTEXT.get()
        routing = context.routing if context is not None else None
        flat = hidden_states.reshape(-1, self.in_features)
        token_index = routing.token_index if routing is not None else None
        if token_index is not None:  # padding tokens are not routed: the base linear alone
            token_index = token_index.to(flat.device)
            flat = flat.index_select(0, token_index)
        logits, weights, index = self.route(flat)
        codes = self.expert_codes(flat)
        # (tokens, E): gate × alpha / r for the chosen experts, zero for the others
        gates = torch.zeros(codes.shape[:2], dtype=codes.dtype, device=codes.device)
        gates = gates.scatter(1, index, (weights * self.scaling).to(codes.dtype))
        if routing is not None and routing.contrastive:  # every expert compared, for the loss only
            anchor = torch.randint(self.top_k, (flat.shape[0],), device=flat.device)
            similarities = expert_similarities(codes, self.lora_B)
            context.aux.contrastive_losses.append(
                contrastive_expert_loss(similarities, index, anchor, self.tau, self.eps)
            )
        if context is not None:
            context.aux.router_logits.append(logits)
            context.aux.expert_counts.append(torch.bincount(index.reshape(-1), minlength=self.num_experts))
        # Σ_i gate_i · B_i (A_i x): the gated codes times the stacked B, one matmul added into the output
        gated = (codes * gates.unsqueeze(-1)).flatten(1).to(output.dtype)
        flat_b = self.lora_B.transpose(1, 2).reshape(self.num_experts * self.rank, self.out_features)
        flat_output = output.view(-1, self.out_features)
        if token_index is None:
            flat_output.addmm_(gated, flat_b.to(output.dtype))
        else:
            flat_output.index_add_(0, token_index, gated @ flat_b.to(output.dtype))
        return output


class CoMoeLayer(EncoderLayer):
    """A BERT layer whose target linears are `CoMoeLinear`s; returns what they report as its aux output."""

    def __init__(self, config: CoMoeBertConfig, layer_idx: int):
        super().__init__(config, layer_idx)
        for name in config.target_modules:
            parent_name, _, attribute = name.rpartition(".")
            parent = self.get_submodule(parent_name)
            dense = getattr(parent, attribute)
            setattr(parent, attribute, CoMoeLinear(dense.in_features, dense.out_features, config))

    def forward(self, hidden_states, attention_mask=None, routing=None, **kwargs):
        aux = CoMoeLayerAux()
        token = _LAYER_CONTEXT.set(_LayerContext(routing, aux))
        try:
            output, weights, _ = super().forward(hidden_states, attention_mask, routing, **kwargs)
        finally:
            _LAYER_CONTEXT.reset(token)
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

    def __init__(self, config: CoMoeBertConfig):
        super().__init__(config)
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

    def aux_loss_from_layer_aux(self, layer_aux: tuple[CoMoeLayerAux, ...], device: torch.device) -> torch.Tensor:
        """The output's `aux_loss` computed from what the layer stack returned (`layer_aux`: each CoMoE
        layer's report of one forward pass), on `device`:
        `contrastive_loss_coef · contrastive loss + router_aux_loss_coef · load balancing`, the term a
        training loss adds. Same meaning as `MoeBertModel.aux_loss_from_layer_aux`."""
        return self._weighted_aux_loss(self.contrastive_loss(layer_aux, device), layer_aux, device)

    def _weighted_aux_loss(self, contrastive: torch.Tensor | None, layer_aux, device) -> torch.Tensor:
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
        return {name: tensor for name, tensor in self.state_dict().items() if is_adapter_key(name)}

    def num_parameters_by_kind(self) -> tuple[int, int]:
        """`(trainable, total)` parameter counts."""
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return trainable, sum(p.numel() for p in self.parameters())

    def save_pretrained(self, save_directory, *args, adapter_only: bool = False, base_model_name_or_path=None, **kw):
        """`PreTrainedModel.save_pretrained`, or with `adapter_only=True` the adapters alone (a few MB):
        `config.json` and the model code, `adapter_config.json` naming the base model
        (`base_model_name_or_path`, default `config.base_model_name_or_path`) and `adapter_model.safetensors`."""
        if not adapter_only:
            return super().save_pretrained(save_directory, *args, **kw)
        base = base_model_name_or_path or self.config.base_model_name_or_path
        if not base:
            raise ValueError(
                "an adapter-only folder must name its base model: pass base_model_name_or_path= "
                "(a Hub id or a local folder of the dense model)"
            )
        os.makedirs(save_directory, exist_ok=True)
        stale = [name for name in os.listdir(save_directory) if name.startswith("model") and ".safetensors" in name]
        if stale:
            raise ValueError(f"{save_directory} already holds full model weights ({stale[0]}); save to a new folder")
        config = copy.deepcopy(self.config)
        config.base_model_name_or_path = str(base)
        if self._auto_class is not None:
            custom_object_save(self, save_directory, config=config)
        config.save_pretrained(save_directory)
        _write_json(os.path.join(save_directory, ADAPTER_CONFIG_NAME), adapter_config(config))
        from safetensors.torch import save_file

        tensors = {ADAPTER_KEY_PREFIX + name: t.detach().contiguous() for name, t in self.adapter_state_dict().items()}
        save_file(tensors, os.path.join(save_directory, ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
        self._write_sentence_transformers_files(save_directory)

    def _write_sentence_transformers_files(self, save_directory: str) -> None:
        """Make an adapter-only folder load with `SentenceTransformer(DIR, trust_remote_code=True)`.

        sentence-transformers reads an `adapter_config.json` as a peft adapter (and fails on this adapter
        type) unless the folder names this package's input module. So the module files are copied, from
        beside this file or from the folder the model was loaded from, with that folder's tokenizer, pooling
        and prompts when it has them (mean pooling otherwise). Files already in `save_directory` are kept."""
        sources = [os.path.dirname(os.path.abspath(__file__)), str(self.name_or_path or "")]
        source = next(
            (s for s in sources if os.path.isfile(os.path.join(s, FOLDER_FILES[self.config.model_type][0]))), None
        )
        if source is None:
            logger.warning(
                "%s loads with AutoModel only: the Sentence-Transformers module files were not found beside the "
                "model code; write the folder with convert/extract_adapter.py instead",
                save_directory,
            )
            return
        for name in FOLDER_FILES[self.config.model_type]:
            if not os.path.exists(os.path.join(save_directory, name)):
                shutil.copy2(os.path.join(source, name), os.path.join(save_directory, name))
        loaded_from = str(self.name_or_path or "")
        for name in TOKENIZER_FILES:  # sentence-transformers loads the tokenizer from the folder itself
            path = os.path.join(loaded_from, name)
            if os.path.isfile(path) and not os.path.exists(os.path.join(save_directory, name)):
                shutil.copy2(path, os.path.join(save_directory, name))
        if os.path.exists(os.path.join(save_directory, "modules.json")):
            return
        if os.path.isfile(os.path.join(loaded_from, "modules.json")):
            with open(os.path.join(loaded_from, "modules.json"), encoding="utf-8") as handle:
                modules = json.load(handle)
            for name in ("sentence_bert_config.json", "config_sentence_transformers.json"):
                if os.path.isfile(os.path.join(loaded_from, name)):
                    shutil.copy2(os.path.join(loaded_from, name), os.path.join(save_directory, name))
            for entry in modules[1:]:
                if entry.get("path") and os.path.isdir(os.path.join(loaded_from, entry["path"])):
                    shutil.copytree(
                        os.path.join(loaded_from, entry["path"]), os.path.join(save_directory, entry["path"])
                    )
        else:
            os.makedirs(os.path.join(save_directory, "1_Pooling"), exist_ok=True)
            pooling = {"word_embedding_dimension": self.config.hidden_size, "pooling_mode_mean_tokens": True}
            _write_json(os.path.join(save_directory, "1_Pooling", "config.json"), pooling)
            modules = [{}, {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
        modules[0] = {"idx": 0, "name": "0", "path": "", "type": ST_MODULES[self.config.model_type]}
        _write_json(os.path.join(save_directory, "modules.json"), modules)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """`PreTrainedModel.from_pretrained`; an adapter-only folder (with `adapter_config.json`) loads the
        base model it names, checked against the adapter's shapes before any weight is read, then the adapters."""
        hub_kwargs = {key: kwargs[key] for key in _HUB_KWARGS if key in kwargs}
        found = cached_file(
            pretrained_model_name_or_path,
            ADAPTER_CONFIG_NAME,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
        settings = _read_json(found) if found else None
        if not settings or settings.get("peft_type") != ADAPTER_PEFT_TYPE:
            loaded = super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
            (loaded[0] if isinstance(loaded, tuple) else loaded).freeze_base()
            return loaded
        where = f"{pretrained_model_name_or_path}/{ADAPTER_CONFIG_NAME}"
        config = kwargs.pop("config", None)
        if not isinstance(config, CoMoeBertConfig):
            config = cls.config_class.from_pretrained(pretrained_model_name_or_path, **hub_kwargs)
        kwargs.pop("adapter_kwargs", None)  # transformers' peft integration: this adapter is loaded below
        want_info = kwargs.pop("output_loading_info", False)
        mismatch = {
            key: (settings.get(key), value)
            for key, value in adapter_config(config).items()
            if key in ("target_modules", "layers_to_transform", "r", "num_experts") and settings.get(key) != value
        }
        if mismatch:
            raise ValueError(f"{where} disagrees with its config.json on {mismatch} (adapter_config, config)")
        base = resolve_base(settings.get("base_model_name_or_path"), pretrained_model_name_or_path, where)
        base_kwargs = {k: v for k, v in kwargs.items() if k not in ("revision", "subfolder")}  # they locate the adapter
        base_config = _base_config(base, where, {k: v for k, v in hub_kwargs.items() if k in base_kwargs})
        differ = {
            key: (getattr(config, key), base_config.get(key))
            for key in BASE_SHAPE_FIELDS
            if base_config.get(key) != getattr(config, key)
        }
        if differ:
            raise ValueError(
                f"the base model {base!r} does not fit the adapter in {pretrained_model_name_or_path}: "
                + ", ".join(f"{key} {want} (adapter) vs {got} (base)" for key, (want, got) in differ.items())
            )
        # The base has no adapter tensors: keep them out of the load report while loading it.
        own_setting = cls.__dict__.get("_keys_to_ignore_on_load_missing")
        cls._keys_to_ignore_on_load_missing = [rf"{re.escape(suffix)}$" for suffix in ADAPTER_SUFFIXES]
        try:
            model, info = super().from_pretrained(
                base, *model_args, config=config, output_loading_info=True, **base_kwargs
            )
        finally:
            cls._keys_to_ignore_on_load_missing = own_setting
        missing = sorted(info["missing_keys"])
        if missing:
            raise ValueError(f"the base model {base!r} lacks weights the adapter needs: {missing[:5]}")
        weights = cached_file(pretrained_model_name_or_path, ADAPTER_WEIGHTS_NAME, **hub_kwargs)
        model.load_adapter_weights(weights)
        model.freeze_base()
        return (model, info) if want_info else model

    def load_adapter_weights(self, path: str) -> None:
        """Load `adapter_model.safetensors` into the adapters; its tensors must be exactly the model's adapters."""
        from safetensors.torch import load_file

        loaded = {key.removeprefix(ADAPTER_KEY_PREFIX): tensor for key, tensor in load_file(path).items()}
        expected = self.adapter_state_dict()
        if set(loaded) != set(expected):
            extra, lacking = sorted(set(loaded) - set(expected)), sorted(set(expected) - set(loaded))
            raise ValueError(
                f"{path} does not hold this model's adapters (target modules {self.config.target_modules}, "
                f"layers {self.config.adapter_layers}): unexpected {extra[:3]}, missing {lacking[:3]}"
            )
        for name, tensor in loaded.items():
            if tensor.shape != expected[name].shape:
                raise ValueError(
                    f"{path}: {name} has shape {tuple(tensor.shape)}, expected {tuple(expected[name].shape)}"
                )
        with torch.no_grad():
            for name, tensor in loaded.items():
                expected[name].copy_(tensor)


def adapter_config(config: CoMoeBertConfig) -> dict:
    """The `adapter_config.json` of an adapter-only folder (peft's field names where they exist)."""
    return {
        "peft_type": ADAPTER_PEFT_TYPE,
        "library_name": LIBRARY_NAME,
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": config.base_model_name_or_path,
        "r": config.lora_rank,
        "lora_alpha": config.lora_alpha,
        "lora_dropout": config.lora_dropout,
        "target_modules": list(config.target_modules),
        "layers_to_transform": list(config.adapter_layers),
        "num_experts": config.num_local_experts,
        "num_experts_per_tok": config.num_experts_per_tok,
        "contrastive_loss_coef": config.contrastive_loss_coef,
    }


def resolve_base(base: str | None, adapter_path, where: str) -> str:
    """The base model named by an adapter: a Hub id, or a local folder (relative paths are tried
    against the working directory, then against the adapter folder)."""
    if not base:
        raise ValueError(f"{where} names no base_model_name_or_path")
    if os.path.isdir(base) or os.path.isabs(base):
        return base
    beside = os.path.join(str(adapter_path), base)
    return beside if os.path.isdir(beside) else base


def _base_config(base: str, where: str, hub_kwargs: dict) -> dict:
    try:
        return _read_json(cached_file(base, "config.json", **hub_kwargs))
    except OSError as error:
        raise ValueError(
            f"cannot find the base model {base!r} named in {where}: {str(error).splitlines()[0]} "
            "(a local folder must exist; a Hub id needs a connection or the Hugging Face cache)"
        ) from None


def _write_json(path, data) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2)
        handle.write("\n")


def _read_json(path) -> dict:
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


__all__ = [
    "CoMoeBertModel",
    "CoMoeBertPreTrainedModel",
    "CoMoeLayer",
    "CoMoeLinear",
    "CoMoeRouter",
    "CoMoeModelOutput",
    "CoMoeRouting",
    "contrastive_expert_loss",
    "top_k_gates",
    "expert_similarities",
    "is_adapter_key",
]
