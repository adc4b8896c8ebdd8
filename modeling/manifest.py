"""What a saved model folder of each type holds besides its weights, and the names the files in saved
folders share: one copy of each, read by the converters, the model code and the model cards.

Folders whose code imports it (CoMoE's) hold it inlined into their code file.
"""

# adapter-only CoMoE folders: peft's file names, and the adapter type written into adapter_config.json
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_PEFT_TYPE = "COMOE"
LIBRARY_NAME = "moe-embed"
# config fields that size the encoder: an adapter and the base it is loaded on must agree on them
BASE_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)

# the tokenizer files a folder may hold (WordPiece, BPE, SentencePiece)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "added_tokens.json",
)

# Hub metadata of every folder this package writes, then the tags of each model type
HUB_TAGS = ("sentence-transformers", "feature-extraction", "moe-embed")
FAMILY_TAGS = {"mote_bert": ("mote",), "moe_bert": ("moe",), "comoe_bert": ("comoe", "lora", "peft"), "aea": ("aea",)}
MODEL_TYPE_TAGS = {model_type: ("mixture-of-experts", *tags) for model_type, tags in FAMILY_TAGS.items()}
# tags of a folder merged back into a plain encoder, by how it was merged
MERGE_TAGS = {
    "average": ("expert-averaging",),  # Expert Averaging of MoTE or token-MoE experts
    "task": ("task-expert",),  # one MoTE task's experts, unchanged
    "lora": ("merged-lora",),  # CoMoE's LoRA experts folded into the base weights
}

# the Sentence-Transformers input module of each folder type ("file.Class", the file at the folder root)
ST_MODULES = {
    "mote_bert": "st_mote.MoteTransformer",
    "moe_bert": "st_moe.MoeTransformer",
    "comoe_bert": "st_comoe.CoMoeTransformer",
    "aea": "st_aea.AeaTransformer",
}

# the code files a folder of each type holds, each generated at save time from the module of the same name
# in modeling/ and every sibling it imports (`moe_embed.convert.remote_code`): the model and its config, and
# the Sentence-Transformers module
FOLDER_FILES = {
    "mote_bert": ("modeling_mote.py", "st_mote.py"),
    "moe_bert": ("modeling_moe.py", "st_moe.py"),
    "comoe_bert": ("modeling_comoe.py", "st_comoe.py"),
    "aea": ("st_aea.py",),  # the model's own code (transformers', or a moe_bert folder's) is saved with it
}
# `config.json`'s `auto_map` of each model type: the config class lives in the model's file
AUTO_MAP = {
    "mote_bert": {"AutoConfig": "modeling_mote.MoteBertConfig", "AutoModel": "modeling_mote.MoteBertModel"},
    "moe_bert": {"AutoConfig": "modeling_moe.MoeBertConfig", "AutoModel": "modeling_moe.MoeBertModel"},
    "comoe_bert": {"AutoConfig": "modeling_comoe.CoMoeBertConfig", "AutoModel": "modeling_comoe.CoMoeBertModel"},
}

__all__ = [
    "BASE_SHAPE_FIELDS",
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "ADAPTER_PEFT_TYPE",
    "LIBRARY_NAME",
    "TOKENIZER_FILES",
    "HUB_TAGS",
    "FAMILY_TAGS",
    "MODEL_TYPE_TAGS",
    "ST_MODULES",
    "FOLDER_FILES",
    "AUTO_MAP",
    "MERGE_TAGS",
]
