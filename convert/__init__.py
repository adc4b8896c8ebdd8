"""Command-line converters and what they share. Every script runs as `python convert/<name>.py --help`.

Scripts:

- `upcycle.py`: a dense BERT-style checkpoint -> a MoTE, token-routed MoE or CoMoE folder, checked to
  compute the dense model's function where the architecture allows it.
- `merge_experts.py`: an expert folder -> a plain dense transformers model (Expert Averaging, or the
  experts of one task).
- `extract_adapter.py`: the adapter-only form of a CoMoE folder, naming its base model.
- `calibrate_aea.py`: AEA calibration of a trained MoE model, written as a folder that embeds with it.
- `export_onnx.py`: an expert folder -> ONNX, with its pooling and normalisation in the graph.
- `push_to_hub.py`: validate a folder in a fresh process and publish it to the Hugging Face Hub.

Shared by the scripts:

- `folders.py`: the folder contract: opening model folders for a set of allowed model types and
  checking outputs (refused in one line before any work).
- `checkpoint.py`: reading dense checkpoints, mapping state dicts with every key and shape checked,
  and writing complete model folders atomically.
- `layout.py`: the checkpoint key layout of every model type (dense keys -> expert keys and back).
- `cards.py`: model cards rendered from `hub_cards/` from what a folder holds.
"""
