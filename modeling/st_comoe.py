"""Sentence-Transformers input module of CoMoE folders: `st_moe.MoeTransformer` (the contrastive expert loss
kept in the features as `aux_loss`) that also loads adapter-only folders.

sentence-transformers takes a folder with `adapter_config.json` for a peft adapter, and peft cannot read a
CoMoE one; this module reads such a folder's own `config.json` instead, and the model's `from_pretrained`
loads the base model the adapter names. Saved at the root of the model folder and named in `modules.json`
as `st_comoe.CoMoeTransformer`, so it needs `trust_remote_code=True`.
"""

from transformers import AutoConfig

from .comoe_adapter import is_comoe_adapter, read_adapter_config
from .st_moe import MoeTransformer


class CoMoeTransformer(MoeTransformer):
    """`MoeTransformer` that loads CoMoE adapter-only folders as well as full ones."""

    def _load_config(self, model_name_or_path: str, *args):
        """`Transformer._load_config`, except that a CoMoE adapter folder is not taken for a peft one: its
        `config.json` is the model's config and the model loads its base itself. `args` are
        `(backend, config_kwargs)` on sentence-transformers 6, `(cache_dir, backend, config_args)` on 5."""
        config_kwargs = dict(args[-1] or {})
        if len(args) == 3 and args[0] is not None:
            config_kwargs.setdefault("cache_dir", args[0])
        if is_comoe_adapter(read_adapter_config(model_name_or_path, **config_kwargs)):
            return AutoConfig.from_pretrained(model_name_or_path, **config_kwargs), False
        return super()._load_config(model_name_or_path, *args)


__all__ = ["CoMoeTransformer"]
