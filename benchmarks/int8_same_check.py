"""int8 of a MoTE export against its dense base's, each fitted to the same check: the dense folder is exported as
it is (checked on plain text) and again with the MoTE's prompts in its Sentence-Transformers config (checked on the
same rows as the MoTE, every text plain and behind each prompt), and the three int8 graphs are timed alone in new
processes (`benchmarks.session_rate`), alternating, on one feed of `--batch-size` rows behind the query prompt.

    python -m benchmarks.int8_same_check DENSE MOTE_ONNX WORK --seq-lens 16,128 --rounds 3

DENSE is the dense Sentence-Transformers folder the MoTE was upcycled from, MOTE_ONNX the MoTE's `moe-embed export
--quantize int8` folder, WORK a new folder for the two dense exports. Prints a table: seq/s (median of the rounds)
and the ratio to the dense graph of the plain check, with how many matmul inputs each fit kept in fp32.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.options import command_parser, parse

REPO = Path(__file__).resolve().parent.parent
INT8 = "onnx/model_qint8_avx512_vnni.onnx"
ST_CONFIG = "config_sentence_transformers.json"


def dense_with_prompts(dense: Path, mote_onnx: Path, out: Path) -> None:
    """A copy of `dense` whose Sentence-Transformers config holds the MoTE's prompts (nothing else changes)."""
    shutil.copytree(dense, out)
    config = json.loads((out / ST_CONFIG).read_text()) if (out / ST_CONFIG).is_file() else {}
    config["prompts"] = json.loads((mote_onnx / ST_CONFIG).read_text())["prompts"]
    (out / ST_CONFIG).write_text(json.dumps(config, indent=2))


def export(folder: Path, out: Path) -> None:
    command = [sys.executable, "-m", "moe_embed.cli", "export", str(folder), "--output", str(out), "--quantize", "int8"]
    subprocess.run(command, check=True, cwd=REPO)


def fp32_inputs(folder: Path) -> str:
    variant = json.loads((folder / "onnx_config.json").read_text())["int8"]["variants"]["avx512_vnni"]
    return f"{variant.get('fp32_inputs', 0)} of {variant.get('inputs', '?')}" if variant.get("smoothquant") else "0"


def feed(mote_onnx: Path, batch_size: int, seq_len: int, path: Path) -> None:
    """`batch_size` rows of `seq_len` tokens behind the query prompt, tokenised by the MoTE's `tokenizer.json`."""
    import numpy as np
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(mote_onnx / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(seq_len)
    words = ("the quick brown fox jumps over the lazy dog near a river bank " * 60).split()
    prompt = json.loads((mote_onnx / ST_CONFIG).read_text())["prompts"]["query"]
    rows = [tokenizer.encode(prompt + " ".join(words[start:])).ids for start in range(batch_size)]
    if any(len(row) != seq_len for row in rows):
        raise UsageError(f"--seq-lens: {seq_len} is more tokens than the feed's text gives")
    ids = np.array(rows, dtype=np.int64)
    np.savez(path, input_ids=ids, attention_mask=np.ones_like(ids), token_type_ids=np.zeros_like(ids))


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__.split("\n\n")[0])
    parser.add_argument("dense", type=Path, help="the dense Sentence-Transformers folder the MoTE was upcycled from")
    parser.add_argument("mote_onnx", type=Path, help="the MoTE's `moe-embed export --quantize int8` folder")
    parser.add_argument("work", type=Path, help="a new folder for the dense exports and the feeds")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seq-lens", default="16,128", help="comma-separated tokens per row")
    parser.add_argument("--rounds", type=int, default=3, help="rounds in which the graphs alternate")
    parser.add_argument("--min-time", type=float, default=3.0, help="seconds of calls per timing")
    args = parse(parser, argv)
    if not (args.mote_onnx / INT8).is_file():
        parser.error(f"expected a folder of `moe-embed export --quantize int8` as MOTE_ONNX, got {args.mote_onnx}")
    if args.work.exists():
        parser.error(f"WORK must not exist yet, got {args.work}")
    args.work.mkdir(parents=True)
    dense_with_prompts(args.dense, args.mote_onnx, args.work / "dense-prompts")
    folders = {"dense, plain check": args.work / "dense-onnx", "dense, prompt check": args.work / "dense-prompts-onnx"}
    export(args.dense, folders["dense, plain check"])
    export(args.work / "dense-prompts", folders["dense, prompt check"])
    folders["MoTE, one task"] = args.mote_onnx
    print("| graph | fp32 inputs | batch | tokens | int8 (seq/s) | of dense, plain check |")
    print("|---|---:|---:|---:|---:|---:|")
    for seq_len in [int(n) for n in args.seq_lens.split(",")]:
        path = args.work / f"feed-{seq_len}.npz"
        feed(args.mote_onnx, args.batch_size, seq_len, path)
        rates = {name: [] for name in folders}
        for _ in range(args.rounds):
            for name, folder in folders.items():
                command = [sys.executable, "-m", "benchmarks.session_rate", str(folder / INT8), str(path)]
                done = subprocess.run(command + ["--min-time", str(args.min_time)], capture_output=True, text=True,
                                      cwd=REPO, check=True)  # fmt: skip
                rates[name].append(float(done.stdout.split()[-2]))
        base = statistics.median(rates["dense, plain check"])
        for name, folder in folders.items():
            rate = statistics.median(rates[name])
            cells = [name, fp32_inputs(folder), args.batch_size, seq_len, f"{rate:.1f}", f"{rate / base:.2f}"]
            print("| " + " | ".join(str(cell) for cell in cells) + " |")


if __name__ == "__main__":
    run_cli(main)
