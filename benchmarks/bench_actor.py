"""The rate of one `moe-embed embed` actor on this machine's device (a GPU where torch sees one, else the CPU),
against `SentenceTransformer.encode` in the same process: what each actor adds to a cluster.

    python -m benchmarks.bench_actor                                   # MiniLM, its MoTE and its token MoE
    python -m benchmarks.bench_actor --base FOLDER --families dense --batch-sizes 64,512 --words 100-200

The families are the dense base model (the bundled all-MiniLM-L6-v2 by default) and the base upcycled by
`moe-embed upcycle` to MoTE (embedding with `--task document`) and to the token-routed MoE (8 experts, top-2),
each loaded once. For each family and batch size the same corpus is embedded two ways, in interleaved rounds:

- `encode`: `SentenceTransformer.encode` over every text in one call;
- `actor`: what one Ray Data actor of `moe-embed embed` runs for each of its shards, without Ray around it
  (`moe_embed.training.embed.embed_shard`: read the shard from the JSON-lines corpus, check its rows, embed through
  `moe_embed.training.embedders.Embedder`, write the Parquet shard and its summary).

A cluster's rate is about the sum of its actors' rates (shards are independent), so `actor` times the number of
actors is what to expect of a job on many nodes or GPUs; `benchmarks/bench_embed.py` measures the whole job
with Ray on one machine.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.bench_embed import corpus_texts, rows_per_second, write_corpus
from benchmarks.common import cpu_description
from moe_embed.errors import UsageError, run_cli
from moe_embed.options import command_parser, parse

FAMILIES = {"dense": None, "mote": "mote", "moe": "moe"}  # family -> `moe-embed upcycle --arch`
TASKS = {"mote": "document"}


def family_folder(family: str, base: str, work: Path) -> str:
    """The folder of `family`: the base itself, or the base upcycled into `work`."""
    if FAMILIES[family] is None:
        return base
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    return str(upcycle(upcycle_options(output=work / family, arch=FAMILIES[family], base=base)))


def time_encode(model, texts: list[str], batch_size: int, task: str | None) -> float:
    kwargs = {"prompt_name": task} if task else {}
    start = time.perf_counter()
    vectors = model.encode(texts, batch_size=batch_size, convert_to_numpy=True, **kwargs)
    assert len(vectors) == len(texts)
    return time.perf_counter() - start


def time_actor(embedder, shards, options, output: Path) -> float:
    from moe_embed.training.embed import embed_shard

    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    start = time.perf_counter()
    rows = sum(embed_shard(embedder, shard, options, output)["rows"] for shard in shards)
    seconds = time.perf_counter() - start
    assert rows == sum(shard.rows for shard in shards)
    return seconds


def device_description() -> str:
    import torch

    if torch.cuda.is_available():
        return f"GPU {torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"{cpu_description()}, torch {torch.__version__}, {torch.get_num_threads()} threads"


def word_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    try:
        words = int(low), int(high or low)
    except ValueError:
        raise UsageError(f"--words takes a number or a range such as 8-24, got {text!r}") from None
    if not 1 <= words[0] <= words[1]:
        raise UsageError(f"--words needs 1 <= low <= high, got {text!r}")
    return words


def main(argv: list[str] | None = None) -> None:
    parser = command_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="dense Sentence-Transformers folder (default: the bundled MiniLM)")
    parser.add_argument("--families", default=",".join(FAMILIES), help=f"comma-separated, of {', '.join(FAMILIES)}")
    parser.add_argument("--batch-sizes", default="64,256", help="comma-separated texts per model call")
    parser.add_argument("--rows", type=int, default=20_000, help="corpus size (default: %(default)s)")
    parser.add_argument("--words", default="8-24", help="words per text, a range (default: %(default)s)")
    parser.add_argument("--rows-per-shard", type=int, default=10_000, help="the actor's shard size")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default: %(default)s)")
    args = parse(parser, argv)
    families = args.families.split(",")
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        parser.error(f"unknown --families {unknown}; expected names from {', '.join(FAMILIES)}")
    words = word_range(args.words)

    from sentence_transformers import SentenceTransformer

    from moe_embed.folders import bundled_minilm_path
    from moe_embed.training.corpus import Corpus, plan_shards
    from moe_embed.training.embed import EmbedOptions
    from moe_embed.training.embedders import Embedder

    base = args.base or bundled_minilm_path()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = write_corpus(work / "corpus.jsonl", args.rows, words)
        texts = corpus_texts(args.rows, words=words)  # the corpus's texts, as `encode` gets them
        shards = plan_shards(Corpus(str(corpus)), args.rows_per_shard)
        folders = {family: family_folder(family, base, work) for family in families}  # before the table
        print(
            f"{device_description()}; {args.rows} texts of {words[0]}-{words[1]} words; fp32; median of "
            f"{args.rounds} interleaved rounds"
        )
        print("| family | batch | encode (rows/s) | actor (rows/s) | actor / encode |")
        print("|---|---:|---:|---:|---:|", flush=True)
        for family in families:
            folder, task = folders[family], TASKS.get(family)
            model = SentenceTransformer(folder, trust_remote_code=True)
            embedder = Embedder(folder, task, trust_remote_code=True)
            for batch_size in [int(b) for b in args.batch_sizes.split(",")]:
                options = EmbedOptions(folder, str(corpus), work / "out", task=task, batch_size=batch_size)
                time_encode(model, texts[:batch_size], batch_size, task)  # warm-up of both: kernels, allocator
                embedder(texts[:batch_size], batch_size)
                runs = {"encode": [], "actor": []}
                for _ in range(args.rounds):
                    runs["encode"].append(time_encode(model, texts, batch_size, task))
                    runs["actor"].append(time_actor(embedder, shards, options, work / "out"))
                rate = {name: args.rows / statistics.median(seconds) for name, seconds in runs.items()}
                print(
                    f"| {family} | {batch_size} | {rows_per_second(rate['encode'])} | "
                    f"{rows_per_second(rate['actor'])} | {rate['actor'] / rate['encode']:.2f} |",
                    flush=True,
                )
            del model, embedder


if __name__ == "__main__":
    run_cli(main)
