"""Sentence-Transformers input module of AEA folders (written by `convert/calibrate_aea.py`).

sentence-transformers' `Transformer` (tokenizer, model loading, devices) whose forward runs the model
with AEA's expert allocation (`aea_controller.py`, beside this file) and pools the exit layer's hidden states
into the sentence embedding itself: the folder's only module. The allocation, prompt template,
pooling and embedding kind are read from `aea_config.json`. Saved at the root of the model folder and
named in `modules.json` as `st_aea.AeaTransformer`, so it needs `trust_remote_code=True`.
"""

import json
import threading

from transformers.utils import cached_file

from .aea_controller import AdaptiveExpertAllocation
from .aea_pooling import sentence_embedding
from .st_compat import Transformer, tokenize_texts

AEA_CONFIG_NAME = "aea_config.json"


def read_aea_config(model_name_or_path: str, **hub_kwargs) -> dict:
    """`aea_config.json` of a local folder or a Hub repository."""
    path = cached_file(model_name_or_path, AEA_CONFIG_NAME, **hub_kwargs)
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


class AeaTransformer(Transformer):
    """`Transformer` that embeds with adaptive expert allocation.

    Texts are put into `prompt_template` (its `[TEXT]` replaced; PromptEOL for decoders), the model runs
    up to `exit_layer` with `layer_top_k` experts per layer (and per-token counts when `token_wise`),
    and the exit layer's hidden states are pooled (`pooling`: last real token or mean) into
    `features["sentence_embedding"]`, with MoEE's routing weights when `embedding` asks for them.
    Concurrent encodes are serialised: the allocation's hooks share one state per forward pass.
    """

    def __init__(self, model_name_or_path: str, *args, **kwargs):
        super().__init__(model_name_or_path, *args, **kwargs)
        hub_kwargs = {
            key: value
            for key, value in (kwargs.get("config_kwargs") or {}).items()
            if key in ("cache_dir", "token", "revision", "local_files_only")
        }
        self.aea_config = read_aea_config(model_name_or_path, **hub_kwargs)
        config = self.aea_config
        if config["token_wise"] and self.auto_model.config._attn_implementation != "eager":
            self.auto_model.set_attn_implementation("eager")  # token-wise allocation reads attention probabilities
        if self.tokenizer.pad_token is None:  # decoders often have none; padding is masked anyway
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.allocation = AdaptiveExpertAllocation(
            self.auto_model,
            layer_top_k=config["layer_top_k"],
            token_wise=config["token_wise"],
            rounding=config["rounding"],
            exit_layer=config["exit_layer"],
        )
        self._lock = threading.Lock()

    def preprocess(self, inputs, prompt: str | None = None, **kwargs) -> dict:
        """Put each text (after its prompt, if any) into the prompt template, then tokenize as `Transformer` does."""
        template = self.aea_config["prompt_template"]
        texts = [template.replace("[TEXT]", (prompt or "") + t) if isinstance(t, str) else t for t in inputs]
        return tokenize_texts(self, texts, **kwargs)

    def tokenize(self, texts, padding: str | bool = True, **kwargs) -> dict:
        """`preprocess` for texts that already start with their prompt: what sentence-transformers 5.x sends."""
        return self.preprocess(texts, padding=padding, **kwargs)

    def forward(self, features: dict, **kwargs) -> dict:
        input_ids, attention_mask = features["input_ids"], features["attention_mask"]
        embedding = self.aea_config["embedding"]
        with self._lock, self.allocation.apply():
            output = self.allocation(input_ids, attention_mask, output_routing_probs=embedding != "hidden")
        features["token_embeddings"] = output.hidden_states
        features["sentence_embedding"] = sentence_embedding(
            output, attention_mask, self.aea_config["pooling"], embedding
        )
        return features

    def get_embedding_dimension(self) -> int:
        dimension = self.auto_model.config.hidden_size
        if self.aea_config["embedding"] == "hidden":
            return dimension
        ran = self.allocation.layers[: self.allocation.exit_layer]
        return dimension + sum(handles.num_experts for handles in ran if handles.router is not None)


__all__ = ["AeaTransformer", "read_aea_config", "AEA_CONFIG_NAME"]
