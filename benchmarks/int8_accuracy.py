"""Does the exporter's int8 agreement bound guard accuracy? Agreement and suite scores, fp32 against int8.

    python benchmarks/int8_accuracy.py                       # the bundled MiniLM upcycled to MoTE
    python benchmarks/int8_accuracy.py models/run-a models/run-b --tasks STSBenchmark,SciFact,SICK-R

Each folder (MoTE, token MoE or CoMoE, trained or not) is exported by `convert/export_onnx.py --quantize
int8` with no bound, so nothing is refused; each row gives the agreement the exporter measured (min and mean
cosine of int8 to fp32 over `convert/agreement_texts.txt` with every prompt) beside the suite's scores of
the fp32 and the int8 graph, fed as a client feeds them (`benchmarks/bench_serving.py`'s encoder). The
bound (`convert.onnx_int8.DEFAULT_MIN_COSINE`) is meant to refuse the exports whose loss is large.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_serving import int8_scores, score_cells
from convert.checkpoint import read_json
from convert.export_onnx import main as export_onnx
from convert.folders import EXPERT_MODELS, open_model_folder
from convert.upcycle import main as upcycle
from evaluation.data import DATA_DIR_HELP, data_dir
from evaluation.run import TASKS
from moe_embed_cli import HelpFormatter, UsageError, run_cli


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument(
        "model_dirs",
        nargs="*",
        help="MoTE, MoE or CoMoE folders (or Hub ids) to export (default: the bundled MiniLM as MoTE)",
    )
    parser.add_argument("--tasks", default="STSBenchmark,SciFact", help="comma-separated suite tasks")
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    args = parser.parse_args(argv)
    tasks = args.tasks.split(",")
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise UsageError(f"unknown --tasks {unknown}; expected suite tasks from {', '.join(TASKS)}")
    for folder in args.model_dirs:  # every folder before the first long export, as the exporter checks it
        open_model_folder(folder, EXPERT_MODELS)
    root = data_dir(args.data_dir)
    print("| model | min cos | mean cos | " + " | ".join(f"{t} fp32 | {t} int8 | delta" for t in tasks) + " |")
    print("|---|---:|---:|" + "---:|" * (3 * len(tasks)), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        folders = args.model_dirs
        if not folders:
            upcycle(["--output", str(work / "mote")])
            folders = [str(work / "mote")]
        for index, folder in enumerate(folders):
            out = work / f"onnx-{index}"
            export_onnx([folder, "--output", str(out), "--quantize", "int8", "--int8-min-cosine", "1e-9"])
            agreement = read_json(out / "onnx_config.json")["int8"]
            name = Path(folder).name if args.model_dirs else "bundled MiniLM as MoTE"
            cells = score_cells(int8_scores(out, root, tasks))
            print(f"| {name} | {agreement['min_cosine']:.4f} | {agreement['mean_cosine']:.4f} | {cells} |", flush=True)


if __name__ == "__main__":
    run_cli(main)
