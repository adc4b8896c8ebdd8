"""Sentence-Transformers input module for models with an auxiliary training loss: the token-routed
MoE (load balancing, z-loss) and CoMoE (contrastive expert loss, optional load balancing).

sentence-transformers' `Transformer` plus two things: the model's auxiliary loss is kept in the
features as `aux_loss`, so that a training loss can add it (see `training.losses.WithAuxLoss`);
and a CoMoE adapter-only folder (whose `adapter_config.json` is not one peft can read) loads through
the model's own `from_pretrained`, which fetches the base model it names. Saved at the root of the
model folder and named in `modules.json` as `st_moe.MoeTransformer`, so it needs `trust_remote_code=True`.
"""

import json
import threading

from transformers import AutoConfig
from transformers.utils import cached_file

from .manifest import ADAPTER_PEFT_TYPE
from .st_compat import Transformer, init_kwargs, output_name


class MoeTransformer(Transformer):
    """`Transformer` that also returns the model's auxiliary loss as `features["aux_loss"]`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **init_kwargs(kwargs))

    def _load_config(self, model_name_or_path: str, *args):
        """`Transformer._load_config`, except that a CoMoE adapter folder is not taken for a peft one:
        its `config.json` is the model's config and the model loads its base itself. `args` are
        `(backend, config_kwargs)` on sentence-transformers 6, `(cache_dir, backend, config_args)` on 5."""
        config_kwargs = dict(args[-1] or {})
        if len(args) == 3 and args[0] is not None:
            config_kwargs.setdefault("cache_dir", args[0])
        hub_kwargs = {
            k: config_kwargs[k] for k in ("cache_dir", "token", "revision", "local_files_only") if k in config_kwargs
        }
        found = cached_file(
            model_name_or_path,
            "adapter_config.json",
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
            **hub_kwargs,
        )
        if found:
            with open(found, encoding="utf-8") as handle:
                if json.load(handle).get("peft_type") == ADAPTER_PEFT_TYPE:
                    return AutoConfig.from_pretrained(model_name_or_path, **config_kwargs), False
        return super()._load_config(model_name_or_path, *args)

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
