"""Export a MoTE, token-routed MoE, CoMoE or dense folder to a portable ONNX folder that serving engines load.

    moe-embed export models/mote-minilm --output models/mote-minilm-onnx                # routed
    moe-embed export models/mote-minilm --output models/mote-minilm-onnx --quantize int8
    moe-embed export models/mote-minilm --task query --output models/minilm-query-onnx  # one task
    moe-embed export models/moe-minilm --output models/moe-minilm-onnx
    moe-embed export models/comoe-merged --output models/comoe-merged-onnx --quantize int8  # after `merge`

(`python convert/export_onnx.py ...` is the same command.) The folder follows the contract that Text
Embeddings Inference's ONNX backend, fastembed, OpenVINO and onnxruntime with a tokenizer read
(`docs/architecture.md`, "Serving contract"): `onnx/model.onnx` takes `input_ids`, `attention_mask` and
`token_type_ids` (int64, `(batch, seq)`, any batch size and length) and returns `sentence_embedding` first
(the folder's pooling and normalisation applied), then `last_hidden_state` (the token embeddings);
`tokenizer.json`, `config.json` (a plain BERT's, loadable with no remote code), `config_sentence_transformers.json`
(prompts), `sentence_bert_config.json` and the pooling modules sit at the root. A MoTE graph routes each row by the
model's one rule (`modeling/task_router.py`): the prompt a client puts in front of the text picks the expert, a
text without one goes to the default task as it is; nothing is put in or taken off, so `last_hidden_state` lines
up with the client's mask. Its extra output is `routed_task_ids` (each row's expert; -1 and NaN embeddings where
a folder without a default task gets a row without a prompt). `--task-ids-input` adds a
`task_ids` input (`(batch,)`, -1: the prompt decides) for clients that route by id. `--task` exports one
task's experts at the dense model's cost. A dense `bert` / `roberta` / `xlm-roberta` folder, such as the one
`moe-embed merge` writes, exports as a plain graph: merging a CoMoE folder's LoRA experts first (`moe-embed
merge --calibration`, an approximation whose agreement it prints) serves it at the dense model's speed.

The model is traced with this package's model code by `torch.onnx.export(..., dynamo=True)`. Every export
is checked on batches unlike the example: against the PyTorch graph (all outputs) and, tokenised by the
written `tokenizer.json` alone as a client tokenises, against `SentenceTransformer.encode` with every
prompt and none; it is refused when either differs by more than `--tolerance`. `--quantize int8` adds
`onnx/model_qint8_avx512_vnni.onnx` (`convert/onnx_int8.py`, onnxruntime's dynamic int8) and, where OpenVINO
and NNCF are installed (the `openvino` extra), `openvino/openvino_model_qint8_quantized.xml`
(`convert/openvino_int8.py`, static int8 calibrated on texts shipped with the package); it refuses when a
row's cosine to the fp32 embedding falls below `--int8-min-cosine` in either; the README states the measured
agreement.
"""

from __future__ import annotations

from pathlib import Path

from moe_embed.convert.options import ExportOptions
from moe_embed.errors import UsageError, run_cli
from moe_embed.options import parse_options


def export_onnx(options: ExportOptions) -> Path:
    """Write the ONNX folder `options` describe; returns its path."""
    from moe_embed.convert.onnx_folder import write_onnx_folder
    from moe_embed.folders import EXPORTABLE_MODELS, check_output, open_model_folder

    if (Path(options.model_dir) / "aea_config.json").is_file():
        raise UsageError(
            f"{options.model_dir} is an AEA folder: its per-token expert budgets are set by hooks at run time, which "
            "a static graph cannot hold; export the MoE model it was calibrated from"
        )
    opened = open_model_folder(options.model_dir, EXPORTABLE_MODELS)
    if options.task and opened.model_type != "mote_bert":
        raise UsageError("--task applies to MoTE folders; a token-routed model has no task experts")
    if options.task_ids_input and opened.model_type != "mote_bert":
        raise UsageError("--task-ids-input applies to routed MoTE graphs (a MoTE folder without --task)")
    output = check_output(options.output, (opened.path,), options.overwrite)
    return write_onnx_folder(opened.path, output, options)


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    help_text = "\n\n".join(__doc__.split("\n\n")[:2])  # the usage lines, not the design notes below them
    return export_onnx(parse_options(ExportOptions, argv, help_text, prog))


if __name__ == "__main__":
    run_cli(main)
