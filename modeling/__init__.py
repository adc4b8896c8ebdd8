"""Model code of moe-embed. The folder is flat: its files are copied side by side into saved model
folders (remote code), so each imports only the standard library, torch, public transformers names,
sentence-transformers (the `st_*.py` modules only) and siblings through `from .sibling import Name`.

Shared by every model type:

- `configuration_encoder.py`, `modeling_encoder.py`: the BERT-compatible encoder (config fields,
  embeddings, attention, layer stack, pooler) that each model type builds on, plugging in its own
  layer class where the experts are.
- `compat.py`: the transformers names that moved between 4.57 and 5.x, resolved once.

Model types, each a `configuration_<x>.py` and a `modeling_<x>.py`:

- `mote`: MoTE, one expert per task in the expert layers, chosen per sequence by `task` or the
  instruction prefix.
- `moe`: the token-routed sparse MoE encoder (Nomic Embed v2), with load-balancing and z-loss.
- `comoe`: CoMoE-PEFT, top-k routed LoRA experts on a frozen encoder, with the contrastive expert loss.

Other model code:

- `aea.py`: AEA, training-free expert allocation for sentence embeddings from a trained top-k MoE
  model (transformers' OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral and others, and this package's `moe`).

Sentence-Transformers input modules (saved at a folder's root and named in `modules.json`):

- `st_mote.py`: `MoteTransformer`, turning `task`, prompt or raw prefix into expert ids.
- `st_moe.py`: `MoeTransformer`, for `moe` and `comoe`: keeps the model's `aux_loss` in the features
  (for `training.losses.WithAuxLoss`) and loads CoMoE adapter-only folders.
- `st_aea.py`: `AeaTransformer`, the module of AEA folders, running the allocation and pooling the exit layer.
- `st_compat.py`: what those modules need to run on sentence-transformers 5.x as on 6.x.
"""
