"""What a saved model folder of each type holds besides its weights, and the names the files in saved
folders share: one copy of each, read by the converters, the model code and the model cards.

This file is copied into every saved model folder (it is in every entry of `FOLDER_FILES`).
"""

# adapter-only CoMoE folders: peft's file names, and the adapter type written into adapter_config.json
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
ADAPTER_PEFT_TYPE = "COMOE"
LIBRARY_NAME = "moe-embed"

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
MODEL_TYPE_TAGS = {
    "mote_bert": ("mixture-of-experts", "mote"),
    "moe_bert": ("mixture-of-experts", "moe"),
    "comoe_bert": ("mixture-of-experts", "comoe", "lora", "peft"),
    "aea": ("mixture-of-experts", "aea"),
    "dense": ("mote", "expert-averaging"),  # folders merged back into a plain encoder
}

# the Sentence-Transformers input module of each folder type ("file.Class", the file at the folder root)
ST_MODULES = {
    "mote_bert": "st_mote.MoteTransformer",
    "moe_bert": "st_moe.MoeTransformer",
    "comoe_bert": "st_moe.MoeTransformer",
    "aea": "st_aea.AeaTransformer",
}

# files of modeling/ a folder of each type receives beside what `save_pretrained` copies (the model
# code and every sibling it imports): its Sentence-Transformers module and what that module imports
FOLDER_FILES = {
    "mote_bert": ("st_mote.py", "st_compat.py", "manifest.py"),
    "moe_bert": ("st_moe.py", "st_compat.py", "manifest.py"),
    "comoe_bert": ("st_moe.py", "st_compat.py", "manifest.py"),
    "aea": ("aea.py", "st_aea.py", "st_compat.py", "manifest.py"),
}

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "ADAPTER_PEFT_TYPE",
    "LIBRARY_NAME",
    "TOKENIZER_FILES",
    "HUB_TAGS",
    "MODEL_TYPE_TAGS",
    "ST_MODULES",
    "FOLDER_FILES",
]
