"""Model code of moe-embed. The folder is flat and runs from saved model folders (remote code), so each file
imports only the standard library, torch, public transformers names, sentence-transformers (the `st_*.py`
modules only) and siblings through `from .sibling import Name`; a folder holds one generated file per entry
point, each with the siblings it reaches inlined (`moe_embed.convert.remote_code`).

Shared by every model type:

- `configuration_encoder.py`, `modeling_encoder.py`: the BERT-compatible encoder (config fields,
  embeddings, attention, layer stack, pooler) that each model type builds on, plugging in its own
  layer class where the experts are.
- `defaults.py`: the defaults and task tables a command line shows, readable without importing torch.
- `compat.py`, `st_compat.py`: what moved between transformers 4.57 and 5.x, sentence-transformers 5 and 6.
- `manifest.py`: what each folder type holds besides its weights, and the names its files share.
- `st_folder.py`: the Sentence-Transformers files of a folder.

Model types, each a `configuration_<x>.py` and a `modeling_<x>.py`:

- `mote`: MoTE, one expert per task in the expert layers, chosen per sequence by the task (the routing rule,
  for every caller, is `task_router.py`).
- `moe`: the token-routed sparse MoE encoder (Nomic Embed v2); `router_losses.py` holds its
  load-balancing and z-loss, which CoMoE shares.
- `comoe`: CoMoE-PEFT, top-k routed LoRA experts on a frozen encoder: the linear and its contrastive loss
  (`comoe_layer.py`), adapter-only folders (`comoe_adapter.py`), the model (`modeling_comoe.py`).

AEA, training-free expert allocation for sentence embeddings from a trained top-k MoE model (transformers'
OLMoE, Qwen2-MoE, Qwen3-MoE, Mixtral and others, and this package's `moe`): `aea_allocation.py` (the rules),
`aea_layers.py` (the MoE layers of a model), `aea_controller.py` (the hooks that run it),
`aea_homogeneity.py` (calibration), `aea_pooling.py` (sentence embeddings).

Sentence-Transformers input modules (saved at a folder's root and named in `modules.json`):

- `st_mote.py`: `MoteTransformer`, turning the call's task, the prompt or a text's prefix into expert ids.
- `st_moe.py`: `MoeTransformer`, keeping the model's `aux_loss` in the features (for
  `moe_embed.training.losses.WithAuxLoss`); `st_comoe.py`: `CoMoeTransformer`, which also loads adapter-only folders.
- `st_aea.py`: `AeaTransformer`, the module of AEA folders, running the allocation and pooling the exit layer.
"""
