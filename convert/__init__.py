"""The converters: each a command (`moe-embed NAME`, or `python convert/<file>.py`) over a typed function.

- `upcycle.py` (`upcycle`, over `MoteOptions`, `MoeOptions`, `CoMoeOptions`): a dense BERT, RoBERTa, XLM-R,
  MPNet or ModernBERT checkpoint (the bases: `bases.py`) -> a MoTE, token-routed MoE or CoMoE folder, checked to
  compute the dense model's function where the architecture allows it; the work is in `builders.py`, the MoTE task
  prefixes in `task_prefixes.py`.
- `merge_experts.py` (`MergeOptions`, `merge`): an expert folder -> a plain dense transformers model (Expert
  Averaging, one task's experts, CoMoE folded into its base); the work is in `merging.py`.
- `extract_adapter.py`: the adapter-only form of a CoMoE folder, naming its base model.
- `calibrate_aea.py` (`CalibrateOptions`, `calibrate`): AEA calibration of a trained MoE model, written as a
  folder that embeds with it; the work is in `aea_calibration.py`.
- `export_onnx.py` (`ExportOptions`, `export_onnx`): an expert folder -> portable ONNX, with its pooling and
  normalisation (and MoTE's routing) in the graph: `onnx_graph.py`, `onnx_checks.py`, `onnx_int8.py`, `onnx_folder.py`.
- `push_to_hub.py` (`PushOptions`, `push`): validate a folder in a fresh process and publish it.
- `instruction_baseline.py`: the dense model with an expert folder's prompts (the instruction-conditioned
  baseline of the experiments).

Shared by the converters: `checkpoint.py` (reading dense checkpoints, mapping state dicts with every key and
shape checked, tokenizer and code files), `layout.py` (the checkpoint key layout of every model type) and
`cards.py` (model cards rendered from `hub_cards/`).
"""
