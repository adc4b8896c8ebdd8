"""Serving throughput and int8 accuracy of the exported folders, against the dense MiniLM, in one process.

    python -m benchmarks.bench_serving                                   # batch 1, 32, 128 x 16, 128 tokens
    python -m benchmarks.bench_serving --batch-sizes 32 --seq-lens 128 --accuracy
    python -m benchmarks.bench_serving --families dense,mote --backends torch,ort,ort-int8

Families, all from the bundled all-MiniLM-L6-v2: `dense` (the model every user compares with: plain BERT,
mean pooling, normalisation), `mote` (upcycled to MoTE, routed in the graph: each batch mixes the four
tasks by their prompts), `mote-one-task` (the same routed graph, every row with the query prompt, as
`encode(texts, prompt_name="query")` sends a batch), `mote-query` (`--task query`: one task's experts, a plain
graph), `moe` (token
routed, 8 experts, top-2, every other layer), `comoe` (LoRA experts, top-2 of 4, unmerged) and
`comoe-merged` (the same CoMoE folder through `moe-embed merge --calibration` first, the package's calibration
texts: a dense graph; its `torch` is the merged model, so compare with the `comoe` row's `torch` for what
merging gains). Each is exported by `convert/export_onnx.py --quantize int8` (the dense one by the same
tracing, without the MoTE-only parts). Backends: `torch` (the exported graph's PyTorch module, fp32, eager), `ort`,
`ort-int8` (the int8 weights of the `avx512_vnni`, `avx512` and `arm64` files: one graph) and `ort-quint8` (the
uint8 weights of `model_quint8_avx2.onnx`) (onnxruntime CPU, as many threads as torch), `ov` (OpenVINO CPU
reading `onnx/model.onnx`, f32 precision hint) and `ov-int8` (OpenVINO's own static int8,
`openvino/openvino_model_qint8_quantized.xml`, the CPU's default precision for what is not int8). An int8
backend's cell gives its rate against PyTorch and against its runtime's fp32 graph.
Inputs are random token ids, no padding; a MoTE row starts with its task's prompt
(`benchmarks.common.batch_of`). Rates are medians of rounds that interleave the backends; the families run
one after another, each family's sessions freed before the next (every session keeps the memory of its
largest batch). Each row's ratios are to PyTorch fp32 of the same family and to the dense model's same
backend, same run. Timings drift between one family's block and the next by more than the gaps being
measured, so the dense model's sessions of the `--dense-reference` backends (default: onnxruntime int8) are
timed again inside every other family's rounds, and that backend's "of dense" compares the two in the same
rounds; the other backends' "of dense" compare with the dense family's own block. Even in the same rounds,
a session's rate depends on what else the process holds (the same MoTE graph measured 0.70 of dense in these
rounds and 0.98 alone), so a last table times each family's onnxruntime int8 graph alone, in a new process per
timing (`--fresh-rounds`, at `--fresh-batch-sizes`): that table's "of dense" is the one the targets read, over
every call of a timing and in its fastest call (the graph's own cost, with the least of what the host's other
tenants take; `benchmarks/session_rate.py`).

`--accuracy` adds STS-B test and SciFact (the suite's scores, by mteb as `moe-embed evaluate` scores them) of
every family's fp32 graph, its int8 graph through onnxruntime and its OpenVINO int8 model, fed as a client
feeds them (`tokenizer.json` alone; `benchmarks.onnx_encoder`); their data comes from `--data-dir`, else the
Hub, and is read before any export.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.common import batch_of, cpu_description, dense_base, median_rates, prepare, timing_parser
from moe_embed.convert.cpu_graph import GRAPH_FILE
from moe_embed.convert.onnx_int8 import INT8_FILE, INT8_VARIANTS
from moe_embed.convert.openvino_int8 import CALIBRATION_TEXTS, OPENVINO_INT8_FILE
from moe_embed.convert.options import DEFAULT_MIN_COSINE
from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import run_cli
from moe_embed.options import parse

FAMILIES = ("dense", "mote", "mote-one-task", "mote-query", "moe", "comoe", "comoe-merged")
BACKENDS = ("torch", "ort", "ort-int8", "ort-quint8", "ov", "ov-int8")
INT8 = f"onnx/{INT8_FILE}"
QUINT8 = f"onnx/{INT8_VARIANTS['avx2'].file_name}"  # the avx2 family's graph: uint8 weights
FP32_OF = {"ort-int8": "ort", "ort-quint8": "ort", "ov-int8": "ov"}  # an int8 backend's fp32 graph, same runtime
REFERENCE = "dense reference "  # the name prefix of the dense sessions timed in another family's rounds
FEED_TASKS = {"mote-one-task": ["query"]}  # the tasks a family's rows carry (default: every task, mixed)
REPO = Path(__file__).resolve().parent.parent  # where `python -m benchmarks.session_rate` runs


def build(family: str, work: Path, base: str) -> tuple[Path, torch.nn.Module]:
    """The family's exported folder, made from the dense `base` (one already in `work` is taken as it is), and the
    PyTorch module its graph was traced from."""
    from sentence_transformers import SentenceTransformer

    from moe_embed.convert.export_onnx import ExportOptions, export_onnx
    from moe_embed.convert.merge_experts import MergeOptions, merge
    from moe_embed.convert.onnx_checks import quantize_checked
    from moe_embed.convert.onnx_folder import write_folder_files
    from moe_embed.convert.onnx_graph import SentenceEmbeddingGraph, build_graph, export_graph, graph_inputs, session
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    out = work / f"{family}-onnx"
    if family == "dense":
        st = SentenceTransformer(base, device="cpu")
        graph = SentenceEmbeddingGraph(st[0].auto_model.eval(), list(st)[1:])
        if out.exists():
            return out, graph
        out.mkdir(parents=True)
        client = write_folder_files(Path(base), out, st, st.max_seq_length)
        export_graph(graph, graph_inputs(client, ["an example", "two"]), out / GRAPH_FILE, None)
        quantize_checked(out, session(out / GRAPH_FILE), st, client, DEFAULT_MIN_COSINE, list(INT8_VARIANTS))
        return out, graph
    options = {"mote": {}, "moe": {"arch": "moe", "expert_noise": 0.02}, "comoe": {"arch": "comoe"}}
    source = work / family.split("-")[0]  # mote-query, mote-one-task, comoe-merged: the mote and comoe folders
    if not source.exists():
        upcycle(upcycle_options(output=source, base=base, **options[source.name]))
    task = "query" if family == "mote-query" else None
    if family == "comoe-merged":
        merged = work / family
        source = merged if merged.exists() else merge(MergeOptions(source, merged, calibration=CALIBRATION_TEXTS))
    if not out.exists():
        export_onnx(ExportOptions(model_dir=source, output=out, quantize="int8", task=task))
    st = SentenceTransformer(str(source), trust_remote_code=True, device="cpu")
    return out, build_graph(source, st, task)


def random_feed(graph, batch_size: int, seq_len: int, family: str = "") -> dict[str, np.ndarray]:
    """`benchmarks.common.batch_of` (a MoTE row starts with its task's prefix, routed in the graph; every row the
    query's for `mote-one-task`) as a client feeds it: no `task_ids`, token type ids zero."""
    tasks = FEED_TASKS.get(family)
    batch = {k: v.numpy() for k, v in batch_of(graph.model, batch_size, seq_len, tasks).items() if k != "task_ids"}
    return {**batch, "token_type_ids": np.zeros_like(batch["input_ids"])}


def fresh_rates(built: dict, shapes: list, args, threads: int, work: Path) -> dict:
    """onnxruntime int8 seq/s of every family's graph at `shapes`, each timing alone in a new process
    (`benchmarks.session_rate`), the families alternating in each of `args.fresh_rounds` rounds: medians of the
    timings' rates and of their fastest calls'. In the rounds above every session shares one process with the
    others, and there the same graph's rate moved by up to 30% with what else the process held
    (docs/benchmarks.md, run 9)."""
    import statistics
    import subprocess
    import sys

    rates = {}
    for batch_size, seq_len in shapes:
        feeds = {}
        for family, (_, graph) in built.items():
            feeds[family] = work / f"feed-{family}-{batch_size}x{seq_len}.npz"
            np.savez(feeds[family], **random_feed(graph, batch_size, seq_len, family))
        times = {family: [] for family in built}
        for _ in range(args.fresh_rounds):
            for family, (folder, _) in built.items():
                command = [sys.executable, "-m", "benchmarks.session_rate", str(folder / INT8), str(feeds[family])]
                command += ["--threads", str(threads), "--min-time", str(args.min_time)]
                done = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
                if done.returncode:
                    raise RuntimeError(f"timing {family} in a new process failed:\n{done.stderr[-2000:]}")
                times[family].append([float(rate) for rate in done.stdout.split()[-2:]])
        for family, pairs in times.items():  # (rate, fastest call's rate) per round
            columns = zip(*pairs, strict=True)
            rates[family, batch_size, seq_len] = tuple(statistics.median(column) for column in columns)
    return rates


def runners(folder: Path, graph, backends: list[str], threads: int, ov_int8_precision: str | None = None) -> dict:
    """Backend name -> callable(**feed); OpenVINO's int8 model runs at `ov_int8_precision` where given (what is not
    int8), else at the CPU's default."""
    runs = {}
    if "torch" in backends:

        def run_torch(**feed):
            return graph(**{k: torch.from_numpy(v) for k, v in feed.items()})

        runs["torch"] = run_torch
    for name, file in (("ort", GRAPH_FILE), ("ort-int8", INT8), ("ort-quint8", QUINT8)):
        if name in backends:
            import onnxruntime

            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = threads
            session = onnxruntime.InferenceSession(str(folder / file), options, providers=["CPUExecutionProvider"])
            inputs = {i.name for i in session.get_inputs()}
            runs[name] = lambda session=session, inputs=inputs, **feed: session.run(
                ["sentence_embedding"], {k: v for k, v in feed.items() if k in inputs}
            )
    for name, file, precision in (("ov", GRAPH_FILE, "f32"), ("ov-int8", OPENVINO_INT8_FILE, ov_int8_precision)):
        if name in backends:
            from moe_embed.convert.openvino_int8 import OpenVinoSession

            model = OpenVinoSession(folder / file, threads, precision)
            inputs = {i.name for i in model.get_inputs()}
            runs[name] = lambda model=model, inputs=inputs, **feed: model.run(
                ["sentence_embedding"], {k: v for k, v in feed.items() if k in inputs}
            )
    return runs


def int8_scores(folder: Path, tasks: dict) -> dict[str, list[float]]:
    """The scores (0-100) of a folder's fp32 graph and int8 models (onnxruntime's; OpenVINO's where written), fed
    as a client feeds them, on `tasks` (name -> loaded mteb task, `moe_embed.evaluation.run.load_tasks`)."""
    from benchmarks.onnx_encoder import OnnxEncoder
    from moe_embed.evaluation.tasks import score

    files = {"fp32": GRAPH_FILE, "int8": INT8, "ov-int8": OPENVINO_INT8_FILE}
    return {
        precision: [score(OnnxEncoder(folder, file), task) for task in tasks.values()]
        for precision, file in files.items()
        if (folder / file).is_file()
    }


def score_header(tasks) -> str:
    """The header cells of `score_cells`, for `tasks` (names)."""
    return " | ".join(f"{t} fp32 | {t} int8 | delta | {t} ov-int8 | delta" for t in tasks)


def score_cells(scores: dict[str, list[float]]) -> str:
    """`fp32 | int8 | delta | ov-int8 | delta` per task, as table cells (blank where there is no OpenVINO int8)."""
    cells = []
    for index, fp32 in enumerate(scores["fp32"]):
        for precision in ("int8", "ov-int8"):
            value = scores.get(precision, [None] * len(scores["fp32"]))[index]
            cells.append(f"{value:.2f} | {value - fp32:+.2f}" if value is not None else " | ")
        cells[-2] = f"{fp32:.2f} | {cells[-2]}"
    return " | ".join(cells)


def accuracy(folders: dict[str, Path], tasks: dict):
    """Table rows, one per family as it is scored: the loaded suite `tasks` of its fp32 and int8 graph."""
    for family, folder in tqdm(folders.items(), desc="accuracy", unit="family"):
        yield f"| {family} | {score_cells(int8_scores(folder, tasks))} |"


def main(argv: list[str] | None = None) -> None:
    parser = timing_parser(__doc__.split("\n\n")[0], "ignored: every family is built from --base")
    parser.set_defaults(seq_lens="16,128", repeats=7, min_time=0.5)
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated, of {', '.join(BACKENDS)}")
    parser.add_argument("--accuracy", action="store_true", help="also STS-B test and SciFact, fp32 vs int8")
    parser.add_argument(
        "--accuracy-tasks", default="STSBenchmark,SciFact", help="comma-separated suite tasks for --accuracy"
    )
    parser.add_argument("--data-dir", default=None, help=DATA_DIR_HELP)
    parser.add_argument(
        "--fresh-rounds",
        type=int,
        default=5,
        help="rounds of the onnxruntime int8 table timed in a new process per timing (0: none; needs ort-int8)",
    )
    parser.add_argument("--fresh-batch-sizes", default="32", help="comma-separated batch sizes of that table")
    parser.add_argument(
        "--work-dir",
        default=None,
        help="keep the exported folders here, and time those already here as they are (default: a temporary folder)",
    )
    parser.add_argument(
        "--ov-int8-precision",
        default=None,
        help="OpenVINO's precision hint for what its int8 model does not run in int8 (default: the CPU's; f32 under "
        "ONEDNN_MAX_CPU_ISA=AVX2, whose capped kernels have no bf16)",
    )
    parser.add_argument(
        "--dense-reference",
        default=None,
        help="comma-separated backends whose dense session is timed in every family's rounds "
        "(default: ort-int8 where --backends has it; empty: none)",
    )
    args = parse(parser, argv)
    families, backends = args.families.split(","), args.backends.split(",")
    default_references = "ort-int8" if "ort-int8" in backends else ""
    references = [
        b for b in (args.dense_reference if args.dense_reference is not None else default_references).split(",") if b
    ]
    for value, valid, option in (
        (families, FAMILIES, "--families"),
        (backends, BACKENDS, "--backends"),
        (references, backends, "--dense-reference"),
    ):
        unknown = [v for v in value if v not in valid]
        if unknown:
            parser.error(f"unknown {option} {unknown}; expected names from {', '.join(valid)}")
    tasks = {}
    if args.accuracy:  # every task's data read before the long exports
        from moe_embed.evaluation.run import load_tasks, select_tasks

        tasks = load_tasks(select_tasks(args.accuracy_tasks), args.data_dir)
    shapes = prepare(args)
    threads = torch.get_num_threads()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work_dir or tmp)
        built = {}
        for family in tqdm(families, desc="export", unit="family"):  # mote-one-task: mote's graph, other rows
            reuse = family == "mote-one-task" and "mote" in built
            built[family] = built["mote"] if reuse else build(family, work, dense_base(args))
        rates = {}
        for family, (folder, graph) in tqdm(built.items(), desc="timing", unit="family"):
            # One family's sessions at a time (and the dense reference's): every onnxruntime and OpenVINO session
            # keeps the memory of its largest batch, and twenty of them at 128 x 128 exceed 24 GiB.
            sessions = runners(folder, graph, backends, threads, args.ov_int8_precision)
            if family != "dense" and "dense" in built:
                reference = runners(*built["dense"], references, threads)
                sessions.update({f"{REFERENCE}{name}": run for name, run in reference.items()})
            for batch_size, seq_len in shapes:
                feed = random_feed(graph, batch_size, seq_len, family)
                rates[family, batch_size, seq_len] = median_rates(sessions, feed, args.repeats, args.min_time)
            del sessions
        print(f"torch {torch.__version__}, {threads} threads; {cpu_description()}")
        print("| family | batch | tokens | " + " | ".join(f"{b} (seq/s)" for b in backends) + " | best / torch |")
        print("|---|---:|---:|" + "---:|" * (len(backends) + 1))
        for (family, batch_size, seq_len), rate in rates.items():
            cells = []
            for backend in backends:
                cell = f"{rate[backend]:.1f}"
                if backend != "torch" and "torch" in rate:
                    cell += f" ({rate[backend] / rate['torch']:.2f}x"
                    if FP32_OF.get(backend) in rate:  # against its own runtime's fp32 graph
                        cell += f", {rate[backend] / rate[FP32_OF[backend]]:.2f}x fp32 graph"
                    dense = rates.get(("dense", batch_size, seq_len))
                    dense = rate.get(f"{REFERENCE}{backend}", dense and dense[backend])
                    cell += f", {rate[backend] / dense:.2f} of dense)" if dense and family != "dense" else ")"
                cells.append(cell)
            others = [rate[b] for b in backends if b != "torch"]
            best = max(others) / rate["torch"] if others and "torch" in rate else float("nan")
            print(f"| {family} | {batch_size} | {seq_len} | " + " | ".join(cells) + f" | {best:.2f} |")
        if references and "dense" in built and len(built) > 1:  # the drift from block to block, as measured
            print(
                "\n| family | batch | tokens | "
                + " | ".join(f"dense {b} in its rounds (seq/s)" for b in references)
                + " |"
            )
            print("|---|---:|---:|" + "---:|" * len(references))
            for (family, batch_size, seq_len), rate in rates.items():
                if family != "dense":
                    cells = " | ".join(f"{rate[REFERENCE + b]:.1f}" for b in references)
                    print(f"| {family} | {batch_size} | {seq_len} | {cells} |")
        fresh = [(b, s) for b, s in shapes if str(b) in args.fresh_batch_sizes.split(",")]
        if args.fresh_rounds > 0 and "ort-int8" in backends and fresh:
            alone = fresh_rates(built, fresh, args, threads, Path(tmp))
            print(
                "\nonnxruntime int8, each timing alone in a new process (`benchmarks.session_rate`), median of "
                f"{args.fresh_rounds} rounds in which the families alternate; over every call of a timing, and in "
                "its fastest call:"
            )
            print("| family | batch | tokens | ort-int8 (seq/s) | of dense | fastest call (seq/s) | of dense |")
            print("|---|---:|---:|---:|---:|---:|---:|")
            for (family, batch_size, seq_len), pair in alone.items():
                dense = alone.get(("dense", batch_size, seq_len))
                cells = [
                    f"{rate:.1f} | " + (f"{rate / reference:.2f}" if dense and family != "dense" else "")
                    for rate, reference in zip(pair, dense or pair, strict=True)
                ]
                print(f"| {family} | {batch_size} | {seq_len} | {' | '.join(cells)} |", flush=True)
        if args.accuracy:
            print(f"\n| family | {score_header(tasks)} |")
            print("|---|" + "---:|" * (5 * len(tasks)))
            folders = {}  # each folder scored once (mote-one-task's is mote's)
            for family, (folder, _) in built.items():
                folders.setdefault(folder, family)
            for row in accuracy({family: folder for folder, family in folders.items()}, tasks):
                print(row, flush=True)


if __name__ == "__main__":
    run_cli(main)
