"""Does the exporter's int8 agreement bound guard accuracy? Agreement and suite scores, fp32 against int8.

    python -m benchmarks.int8_accuracy                       # the bundled MiniLM upcycled to MoTE
    python -m benchmarks.int8_accuracy models/run-a models/run-b --tasks STSBenchmark,SciFact,SICK-R

Each folder (MoTE, token MoE or CoMoE, trained or not) is exported by `moe-embed export --quantize int8`
with no bound, so nothing is refused; each row gives the agreement the exporter measured (min and mean
cosine of int8 to fp32 over `convert/agreement_texts.txt` with every prompt) beside the suite's scores of
the fp32 and the int8 graph, fed as a client feeds them (`benchmarks.onnx_encoder`) and scored by mteb as
`moe-embed evaluate` scores them, on the data of `--data-dir` (else the Hub), read before the first export. The
bound (`moe_embed.convert.export_onnx.DEFAULT_MIN_COSINE`) is meant to refuse the exports whose loss is large.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.bench_serving import int8_scores, score_cells, score_header
from moe_embed.convert.export_onnx import ExportOptions, export_onnx
from moe_embed.convert.options import upcycle_options
from moe_embed.convert.upcycle import upcycle
from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import UsageError, run_cli
from moe_embed.evaluation.run import TASKS, load_tasks
from moe_embed.files import read_json
from moe_embed.folders import EXPERT_MODELS, open_model_folder
from moe_embed.options import command_parser, parse


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__)
    parser.add_argument(
        "model_dirs",
        nargs="*",
        help="MoTE, MoE or CoMoE folders (or Hub ids) to export (default: the bundled MiniLM as MoTE)",
    )
    parser.add_argument("--tasks", default="STSBenchmark,SciFact", help="comma-separated suite tasks")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    args = parse(parser, argv)
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise UsageError(f"unknown --tasks {unknown}; expected suite tasks from {', '.join(TASKS)}")
    for folder in args.model_dirs:  # every folder and dataset before the first long export
        open_model_folder(folder, EXPERT_MODELS)
    loaded = load_tasks(tasks, args.data_dir)
    print(f"| model | min cos | mean cos | ov min cos | {score_header(tasks)} |")
    print("|---|---:|---:|---:|" + "---:|" * (5 * len(tasks)), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folders = args.model_dirs
        if not folders:
            upcycle(upcycle_options(output=work / "mote"))
            folders = [str(work / "mote")]
        for index, folder in enumerate(folders):
            out = work / f"onnx-{index}"
            export_onnx(ExportOptions(model_dir=folder, output=out, quantize="int8", int8_min_cosine=1e-9))
            int8 = read_json(out / "onnx_config.json")["int8"]
            agreement = int8["variants"]["avx512_vnni"]
            name = Path(folder).name if args.model_dirs else "bundled MiniLM as MoTE"
            cells = score_cells(int8_scores(out, loaded))
            ov = int8.get("openvino", {}).get("min_cosine")
            ov_cell = f"{ov:.4f}" if ov is not None else ""
            print(f"| {name} | {agreement['min_cosine']:.4f} | {agreement['mean_cosine']:.4f} | {ov_cell} | {cells} |")


if __name__ == "__main__":
    run_cli(main)
