"""Embed a corpus on Ray Data, on this machine or a cluster: every row once, resumable.

    moe-embed embed models/mote-minilm corpus.jsonl --output embeddings/ --task document --trust-remote-code
    moe-embed embed models/mote-onnx corpus.parquet --output emb/ --task query   # the graph for this CPU
    moe-embed embed sentence-transformers/all-MiniLM-L6-v2 user/dataset --split train --output emb/ --address auto

The corpus (a .jsonl or .parquet file, a folder of them, or a Hub dataset split) is cut into shards of
`--rows-per-shard` rows (`training/corpus.py`), the same for the same input. Ray Data runs the shards through
a pool of actors, each holding the model once (`map_batches` with a callable class, as Ray's batch-inference
examples do): on a Ray started for the job on this machine by default, on a running cluster with `--address`
(every node must see the input, the model and `--output`, as Ray Data's own readers require). Each shard
becomes `part-NNNNNN.parquet` (columns `id` (a string), `embedding` (float32 list), `task`), written beside
its `_part-NNNNNN.json` (rows read, bad rows, texts longer than the model reads) through a temporary file
renamed into place: a shard is there whole or not at all. The job's own files start with `_`, which Parquet
readers (pyarrow, pandas, Ray Data, Spark) skip, so the folder reads as one Parquet dataset.

Run the same command again after a stop at any point: done shards are kept and the rest is embedded (a job
with other settings in the same folder is refused unless `--overwrite`). A shard that raises is tried again,
and a shard whose actor dies is run again on the restarted actor, `--max-retries` times each (2 by default);
then the job stops in one line, keeping the shards written (deaths are counted by the job itself, in
`_attempts/` under the output, not by Ray's task retries). At the end every shard is checked to hold every row
it read, and every id to appear once; the job fails naming the ids that do not (an input that repeats an id is
refused before anything is embedded).
Rows without an id or with an empty text are not embedded: they are counted, listed in `_bad_rows.jsonl`, and
the command exits 2 after finishing the rest. Texts longer than the model reads are embedded from their first
tokens, as `encode` embeds them, and counted.

An exported ONNX folder is embedded with the graph `--onnx-file` names, else the one for the CPU the command runs
on (`convert/cpu_graph.py`: the int8 graph of the CPU's family where it is measured faster than fp32 there, else
`onnx/model.onnx`; `--verbose` says which and why). It is chosen once, here, for every worker, and is part of the
job: a resumed run embeds with the same graph.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from moe_embed.errors import UsageError, run_cli
from moe_embed.files import atomic_write
from moe_embed.logs import is_verbose
from moe_embed.options import option, parse_options
from moe_embed.training.corpus import Corpus, Shard, plan_shards, read_shard

logger = logging.getLogger(__name__)

# the job's own files start with "_", which Parquet readers skip when they read the folder as a dataset
JOB_FILE = "_embed_job.json"
BAD_ROWS_FILE = "_bad_rows.jsonl"
ACTORS_START_S = 900  # how long a job waits for every actor to hold the model before it hands out shards
ID_CHECK_MIB = 256  # the final check's ids (as 8-byte hashes) held at a time; beyond, spilled to disk in buckets
# how many times each shard of this run was started on an actor: one more than the actors that died on it
ATTEMPTS_DIR = "_attempts"


@dataclass(kw_only=True)
class RayOptions:
    """Where and how wide a job runs, and how often a shard is retried: the options `embed`, `mine` and `filter`
    share (keyword-only, after each command's own)."""

    address: str | None = option(
        help="Ray cluster to run on (e.g. auto, or ray://HOST:10001); default: a local Ray for the job"
    )
    rows_per_shard: int = option(10_000, help="rows per output shard (default: %(default)s)")
    actors: int | None = option(help="model replicas (default: one per node, or one per GPU)")
    cpus_per_actor: float | None = option(help="default: all of a node's CPUs (1 with GPUs)")
    gpus_per_actor: float | None = option(help="default: 1 where the cluster has GPUs, else 0")
    max_retries: int = option(
        2, help="times a shard is run again after it raises or its worker dies (default: %(default)s)"
    )

    def __post_init__(self):
        if self.max_retries < 0:
            raise UsageError(f"--max-retries must not be negative, got {self.max_retries}")
        if self.actors is not None and self.actors < 1:
            raise UsageError(f"--actors must be at least 1, got {self.actors}")
        for name in ("cpus_per_actor", "gpus_per_actor"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"--{name.replace('_', '-')} must not be negative, got {value}")

    def ray_options(self) -> dict:
        """These options alone, to pass on to another job's options."""
        return {spec.name: getattr(self, spec.name) for spec in fields(RayOptions)}


@dataclass
class EmbedOptions(RayOptions):
    """What `embed_corpus` does: the command line's options by their Python names (`moe-embed embed --help`,
    generated from them)."""

    model: str = option(
        required=True,
        positional=True,
        help="a model folder or Hub id (any family, or plain Sentence-Transformers), or an exported ONNX folder",
    )
    input: str = option(
        required=True,
        positional=True,
        help=".jsonl or .parquet file, a folder of them, or a Hub dataset (with --split)",
    )
    output: str | Path = option(required=True, help="folder of parquet shards (the same folder resumes a stopped job)")
    task: str | None = option(help="the prompt to embed with (MoTE: its task, e.g. query or document)")
    id_column: str = option("id", help="column of the ids (default: %(default)s)")
    text_column: str = option("text", help="column of the texts (default: %(default)s)")
    split: str = option("train", help="split of a Hub dataset (default: %(default)s)")
    batch_size: int = option(64, help="texts per model call (default: %(default)s)")
    onnx_file: str | None = option(
        help="graph of an exported ONNX folder (default: the one for this CPU, the int8 graph where it is faster "
        "here, else onnx/model.onnx; --verbose says which)"
    )
    trust_remote_code: bool = option(False, help="allow the model folder's own code (this package's folders)")
    overwrite: bool = option(False, help="replace another job's shards in --output")

    def __post_init__(self):
        super().__post_init__()
        if self.batch_size < 1:
            raise UsageError(f"--batch-size must be at least 1, got {self.batch_size}")

    def job(self, model_path: str, corpus: Corpus) -> dict:
        """What makes two runs the same job (so the second may resume the first)."""
        return {
            "model": model_path,
            "onnx_file": self.onnx_file,
            "task": self.task,
            "input": corpus.fingerprint(),
            "id_column": self.id_column,
            "text_column": self.text_column,
            "rows_per_shard": self.rows_per_shard,
        }


@dataclass
class EmbedReport:
    output: Path
    rows: int  # rows read
    embedded: int
    shards: int
    resumed_shards: int  # shards done before this run
    bad_rows: int
    longer_than_model: int
    seconds: float


def shard_name(index: int) -> str:
    """The shard's Parquet file."""
    return f"part-{index:06d}.parquet"


def summary_name(index: int) -> str:
    """The shard's summary (rows read, bad rows, long texts), written before its Parquet file."""
    return f"_part-{index:06d}.json"


def peak_rss_mib() -> float:
    """This process's peak resident memory so far: Linux's `VmHWM` (getrusage's `ru_maxrss` would carry over the
    parent's peak across fork and exec), else getrusage (which macOS reports in bytes)."""
    import resource
    import sys

    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def embed_shard(embedder, shard: Shard, options: EmbedOptions, output: Path, node: str | None = None) -> dict:
    """Read, check, embed and write one shard; returns what the progress bar needs. `part-NNNNNN.json` records
    the rows read, the bad rows, the long texts, the node (Ray's id) that embedded it, the seconds its embedding
    took (the model's call alone) and the worker's peak memory."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids, texts = read_shard(shard, options.id_column, options.text_column)
    good, bad = [], []
    for i, (id_, text) in enumerate(zip(ids, texts, strict=True)):
        if id_ is None or str(id_) == "":
            bad.append({"row": shard.start + i, "source": shard.source, "id": None, "reason": "missing id"})
        elif not isinstance(text, str) or not text.strip():
            bad.append({"row": shard.start + i, "source": shard.source, "id": str(id_), "reason": "empty text"})
        else:
            good.append(i)
    kept = [texts[i] for i in good]
    with ThreadPoolExecutor(1) as pool:  # the long texts are counted on another core while the model runs
        longer = pool.submit(embedder.longer_than_model, kept)
        started = time.perf_counter()
        vectors = embedder(kept, options.batch_size) if kept else np.zeros((0, embedder.dimension), np.float32)
        seconds = time.perf_counter() - started
        longer = longer.result()
    summary = {
        "shard": shard.to_dict(),
        "rows": len(ids),
        "embedded": len(good),
        "bad_rows": bad,
        "longer_than_model": longer,
        "task": options.task,
        "node": node,
        "embed_seconds": round(seconds, 3),
        "peak_rss_mib": round(peak_rss_mib(), 1),
    }
    table = pa.table(
        {
            "id": pa.array([str(ids[i]) for i in good], pa.string()),
            "embedding": pa.FixedSizeListArray.from_arrays(
                pa.array(vectors.reshape(-1), pa.float32()), vectors.shape[1]
            ),
            "task": pa.array([options.task] * len(good), pa.string()),
        }
    )
    atomic_write(output / summary_name(shard.index), lambda p: Path(p).write_text(json.dumps(summary)))
    atomic_write(output / shard_name(shard.index), lambda p: pq.write_table(table, p))
    return {"index": shard.index, "rows": len(ids)}


class ShardWorker:
    """A Ray Data actor: loads the model once, then embeds the shards of each batch it is given. A subclass may
    stand in for it (`embed_corpus(options, worker=...)`): the tests' workers that die, raise or start late
    override `__init__` or `embed`."""

    def __init__(self, model: str, options: dict, output: str, threads: int | None):
        if threads:
            import torch

            torch.set_num_threads(threads)
        import ray

        from moe_embed.training.embedders import Embedder

        self.options, self.output = EmbedOptions(**options), Path(output)
        self.node = ray.get_runtime_context().get_node_id()
        self.embedder = Embedder(
            model, self.options.task, onnx_file=self.options.onnx_file, trust_remote_code=self.options.trust_remote_code
        )

    def __call__(self, batch):
        import pandas as pd

        return pd.DataFrame([self.embed_with_retries(Shard(**spec)) for spec in batch.to_dict("records")])

    def embed(self, shard: Shard) -> dict:
        """One try at one shard."""
        return embed_shard(self.embedder, shard, self.options, self.output, self.node)

    def embed_with_retries(self, shard: Shard) -> dict:
        """`embed`, tried again (`--max-retries` times) when it raises: a shard is written whole or not at all,
        so a second try is exact. An actor that dies is restarted by Ray and its shard run again, as many times:
        each start is counted in `ATTEMPTS_DIR`, and a shard started once more than that is refused here."""
        tries = self.options.max_retries + 1
        starts = count_attempt(self.output, shard)
        if starts > tries:  # every start after the first followed a death
            raise RuntimeError(f"{DIED} {starts - 1} times running the same shard ({shard.index}): {DIED_WHY}")
        for attempt in range(1, tries + 1):
            try:
                return self.embed(shard)
            except Exception as error:
                if attempt == tries:
                    raise RuntimeError(f"shard {shard.index} failed {tries} times: {error}") from error
                logger.warning("shard %d failed (%s); trying again", shard.index, error)
        raise AssertionError("unreachable")


def resources(options: EmbedOptions) -> tuple[int, float, float]:
    """`(actors, cpus, gpus per actor)`: by default one actor per node holding all its CPUs (torch's threads use
    them), or one per GPU where the cluster has GPUs."""
    import ray

    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    total_gpus = sum(n.get("GPU", 0) for n in nodes)
    gpus = options.gpus_per_actor if options.gpus_per_actor is not None else (1.0 if total_gpus else 0.0)
    if options.cpus_per_actor is not None:
        cpus = options.cpus_per_actor
    else:
        cpus = 1.0 if gpus else min(n.get("CPU", 1) for n in nodes)
    if options.actors is not None:
        actors = options.actors
    elif gpus:
        actors = max(1, int(total_gpus // gpus))
    else:
        actors = max(1, sum(int(n.get("CPU", 0) // cpus) for n in nodes)) if cpus else len(nodes)
    return actors, cpus, gpus


RESUME = "the shards written so far are kept: run the same command to resume, or raise --max-retries"
DIED, DIED_WHY = "a worker died", "out of memory, or a crash"


def count_attempt(output: Path, shard: Shard) -> int:
    """Record one more start of `shard` in this run and return how many there were (the file's length: one byte
    per start, appended, so a count survives the actor that died)."""
    path = output / ATTEMPTS_DIR / f"{shard.index:06d}"
    path.parent.mkdir(exist_ok=True)
    with path.open("ab") as file:
        file.write(b".")
    return path.stat().st_size


# what Ray's C++ core prints, at its INFO level whatever the level it reads, when RAY_BACKEND_LOG_LEVEL is set
RAY_LEVEL_NOTE = "Set ray log level from environment variable RAY_BACKEND_LOG_LEVEL"


def start_ray(address: str) -> None:
    """`ray.init` as quiet as the command: without `--verbose`, Ray's notes on a run that works (its token
    authentication, the core worker's note on actors that can restart) are not printed; Ray's errors, and this
    job's own lines, are."""
    import ray

    if is_verbose():
        ray.init(address=address, include_dashboard=False, logging_level=logging.INFO, log_to_driver=True)
        return
    level = os.environ.get("RAY_BACKEND_LOG_LEVEL")
    os.environ["RAY_BACKEND_LOG_LEVEL"] = level or "fatal"  # read by this process's core worker and those started
    try:
        with stderr_without(RAY_LEVEL_NOTE):  # the one line the setting itself costs (`logging.cc`)
            ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    finally:
        if level is None:
            os.environ.pop("RAY_BACKEND_LOG_LEVEL")


@contextlib.contextmanager
def stderr_without(marker: str):
    """Run the block with this process's standard error (file descriptor 2, where Ray's C++ core writes) caught,
    then pass on every line of it but those that hold `marker`."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no standard error to catch
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            lines = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if marker not in line))
            sys.stderr.flush()


def quiet_ray_data() -> None:
    """Ray Data's plan and timing notes, and its warning that this job draws its own progress bar, only with
    `--verbose` (Ray Data sets its loggers up when it is imported, so this comes after)."""
    import importlib

    importlib.import_module("ray.data")  # which configures the loggers set here
    if not is_verbose():
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)


def run_on_ray(model: str, todo: list[Shard], options: EmbedOptions, output: Path, bar, worker=ShardWorker) -> None:
    """Run the shards `todo` through a pool of `worker` actors, advancing `bar` as shards finish."""
    import ray

    shutil.rmtree(output / ATTEMPTS_DIR, ignore_errors=True)  # this run's starts are counted from zero

    started = not ray.is_initialized()
    if started:
        # no --address: a Ray of the job's own ("local"), never a Ray another process on this machine runs (which
        # `ray.init()` would join: a notebook's, another job's)
        start_ray(options.address or "local")
    quiet_ray_data()
    try:
        actors, cpus, gpus = resources(options)
        logger.info("%d actors of %g CPUs and %g GPUs each, %d shards", actors, cpus, gpus, len(todo))
        threads = int(cpus) if cpus >= 1 and not gpus else None
        shards = ray.data.from_items([shard.to_dict() for shard in todo], override_num_blocks=len(todo))
        done = shards.map_batches(
            worker,
            fn_constructor_kwargs={
                "model": model,
                "options": asdict(options),
                "output": str(output),
                "threads": threads,
            },
            batch_size=1,
            batch_format="pandas",
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=cpus,
            num_gpus=gpus,
        )  # Ray restarts a dead actor and runs its shard again, forever: `embed_with_retries` counts the starts
        context = done.context  # this job's own settings, not those of the caller's Ray Data
        context.enable_progress_bars = False  # this command draws its own, in rows
        # Hand out shards once every actor holds the model: otherwise the first actor up takes the shards the
        # others would get while they load, and a small job runs on one node of many.
        context.wait_for_min_actors_s = ACTORS_START_S
        try:
            for row in done.iter_rows():
                bar.update(int(row["rows"]))
        except ray.exceptions.RayActorError as error:  # unreachable since it died
            what = f"{DIED} {options.max_retries + 1} times running the same shard ({DIED_WHY})"
            raise UsageError(f"{what}; {RESUME}") from error
        except ray.exceptions.RayTaskError as error:  # `embed_with_retries` gave up: its message crossed as text
            failed = re.search(rf"(shard \d+ failed \d+ times|{DIED} \d+ times)[^\n]*", str(error))
            if failed is None:
                raise
            raise UsageError(f"{failed.group(0)}; {RESUME}") from error
    finally:
        shutil.rmtree(output / ATTEMPTS_DIR, ignore_errors=True)
        if started:
            ray.shutdown()


def prepare_output(output: Path, job: dict, overwrite: bool) -> None:
    """Create `output` with the job's description, keep it to resume the same job, refuse another job's."""
    path = output / JOB_FILE
    if output.exists() and any(output.iterdir()):
        previous = read_job(output)
        if previous != job:
            if not overwrite:
                what = "another job's shards" if previous else "files that are not an embed job's"
                raise UsageError(f"{output} holds {what}; pass --overwrite to replace them, or another --output")
            shutil.rmtree(output)
    output.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        atomic_write(path, lambda p: Path(p).write_text(json.dumps(job, indent=2)))


def job_graph(model: str, onnx_file: str | None, output: Path) -> str | None:
    """The graph every worker embeds the ONNX folder `model` with (None: not an ONNX folder): `onnx_file`, else the
    one a job on `model` already in `output` started with, else the one for this CPU. Chosen once, here: workers
    on other kinds of CPU, or a run resumed on another machine, must not embed one corpus with two graphs."""
    from moe_embed.training.embedders import graph_file

    previous = read_job(output) or {}
    started = previous.get("onnx_file") if previous.get("model") == model else None
    return graph_file(model, onnx_file or started)


def read_job(output: Path) -> dict | None:
    """The description of the job whose shards `output` holds (None: no job there)."""
    path = output / JOB_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def is_done(output: Path, shard: Shard) -> bool:
    return (output / shard_name(shard.index)).is_file()


def shard_ids(output: Path, shard: Shard) -> list[str]:
    import pyarrow.parquet as pq

    return pq.read_table(output / shard_name(shard.index), columns=["id"]).column("id").to_pylist()


def id_hashes(ids: list) -> np.ndarray:
    import pandas as pd

    return pd.util.hash_array(np.asarray(ids, dtype=object))


def repeated_hashes(batches: Iterable[np.ndarray], rows: int, memory_mib: float) -> set[int]:
    """The 64-bit hashes that appear more than once in `batches` (`rows` in all), holding about `memory_mib` of
    them at a time: when they need more, they are spilled to files in buckets by their top bits (a hash's every
    copy lands in one bucket), and each bucket is sorted on its own."""
    import tempfile

    bits = min(10, math.ceil(math.log2(max(1.0, rows * 8 / (memory_mib * 2**20)))))  # 2**bits buckets

    def repeated(every: np.ndarray) -> set[int]:  # sorted in place: a bucket's hashes are the check's memory
        every.sort()
        return set(every[1:][every[1:] == every[:-1]].tolist())

    if bits == 0:  # one bucket, in memory
        every, count = np.empty(rows, np.uint64), 0
        for batch in batches:
            if count + len(batch) > len(every):  # more than `rows` (a shard holding more than it read)
                every = np.concatenate([every[:count], np.empty(count + len(batch), np.uint64)])
            every[count : count + len(batch)] = batch
            count += len(batch)
        return repeated(every[:count])
    found = set()
    with tempfile.TemporaryDirectory(prefix="moe-embed-ids-") as spill:
        paths = [Path(spill) / f"bucket-{b}.u64" for b in range(2**bits)]
        files = [path.open("ab") for path in paths]
        try:
            for batch in batches:
                bucket = (batch >> np.uint64(64 - bits)).astype(np.int64)
                order = np.argsort(bucket, kind="stable")
                bounds = np.searchsorted(bucket[order], np.arange(2**bits + 1))
                for b, file in enumerate(files):
                    batch[order[bounds[b] : bounds[b + 1]]].tofile(file)
        finally:
            for file in files:
                file.close()
        for path in paths:
            found |= repeated(np.fromfile(path, dtype=np.uint64))
    return found


def repeated_ids_message(repeated: set[int], ids: Iterable[list]) -> str:
    """What to say of the ids whose hashes are `repeated`, found again in `ids` (lists, one shard's at a time)."""
    names = set()
    for shard in ids:
        names.update(str(shard[i]) for i in np.flatnonzero(np.isin(id_hashes(shard), list(repeated))))
    names = sorted(names)
    return (
        f"the input repeats {len(names)} ids: {', '.join(names[:10])}{' ...' if len(names) > 10 else ''} (each row "
        "needs an id of its own: fix the input, or name another column with --id-column)"
    )


def check_input_ids(shards: list[Shard], options: EmbedOptions) -> None:
    """Refuse an input that repeats an id before anything is embedded: one read of the ids, `ID_CHECK_MIB` of their
    hashes held at a time (a row without an id is a bad row, counted later, not a repeat)."""

    def ids_of(shard: Shard) -> list:
        ids = read_shard(shard, options.id_column, options.text_column)[0]
        return [str(i) for i in ids if i is not None and str(i) != ""]  # as the output holds them

    rows = sum(shard.rows for shard in shards)
    repeated = repeated_hashes((id_hashes(ids_of(s)) for s in shards), rows, ID_CHECK_MIB)
    if repeated:
        raise UsageError(repeated_ids_message(repeated, (ids_of(s) for s in shards)))


def verify(output: Path, shards: list[Shard]) -> tuple[int, list[dict], int]:
    """Check that every shard holds every row it read and that no id appears twice; returns
    `(embedded, bad rows, longer than the model)`. Ids are compared by 64-bit hashes, `ID_CHECK_MIB` of them at a
    time (`repeated_hashes`), so the check's memory does not grow with the corpus."""
    import pyarrow.parquet as pq

    counts = {"embedded": 0, "longer": 0}
    bad, problems = [], []

    def hashes():  # each shard's ids (embedded and bad), checked for its row count on the way
        for shard in shards:
            summary = json.loads((output / summary_name(shard.index)).read_text())
            rows = pq.ParquetFile(output / shard_name(shard.index)).metadata.num_rows
            if summary["rows"] != shard.rows or rows + len(summary["bad_rows"]) != shard.rows:
                problems.append(
                    f"shard {shard.index} holds {rows} + {len(summary['bad_rows'])} bad of {shard.rows} rows"
                )
            counts["embedded"] += rows
            counts["longer"] += summary["longer_than_model"]
            bad.extend(summary["bad_rows"])
            yield id_hashes(shard_ids(output, shard) + [r["id"] for r in summary["bad_rows"] if r["id"] is not None])

    repeated = repeated_hashes(hashes(), sum(shard.rows for shard in shards), ID_CHECK_MIB)
    if repeated:
        problems.append(repeated_ids_message(repeated, (shard_ids(output, shard) for shard in shards)))
    if problems:
        raise UsageError("the output is not exact: " + "; ".join(problems))
    return counts["embedded"], bad, counts["longer"]


def require(*modules: str) -> None:
    """A one-line error naming the `ray` extra when one of `modules` (ray, faiss) is not installed."""
    import importlib.util

    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise UsageError(f"{' and '.join(missing)} not installed: pip install 'moe-embed[ray]' (Ray Data and faiss)")


def embed_corpus(options: EmbedOptions, worker: type[ShardWorker] = ShardWorker) -> EmbedReport:
    """Embed the corpus `options` names into `options.output`, resuming a stopped run of the same job. `worker`:
    the Ray actor class that embeds shards (a test's stand-in that fails on purpose)."""
    from tqdm.auto import tqdm

    require("ray")

    from moe_embed.folders import check_output
    from moe_embed.training.embedders import check_model

    start = time.perf_counter()
    corpus = Corpus(options.input, options.id_column, options.text_column, options.split)
    model = check_model(options.model, options.task, options.onnx_file, options.trust_remote_code)
    output = Path(options.output)
    options = replace(options, onnx_file=job_graph(model, options.onnx_file, output))
    check_output(output, tuple(corpus.files()) + (Path(model),), overwrite=True)  # overlap only: resuming is allowed
    shards = plan_shards(corpus, options.rows_per_shard)
    check_input_ids(shards, options)  # hours of embedding are not spent on an input the end would refuse
    prepare_output(output, options.job(model, corpus), options.overwrite)
    todo = [shard for shard in shards if not is_done(output, shard)]
    total = sum(shard.rows for shard in shards)
    with tqdm(total=total, initial=total - sum(s.rows for s in todo), unit="rows", desc="embed") as bar:
        if todo:
            run_on_ray(model, todo, options, output, bar, worker)
    embedded, bad, longer = verify(output, shards)
    atomic_write(output / BAD_ROWS_FILE, lambda p: Path(p).write_text("".join(json.dumps(r) + "\n" for r in bad)))
    return EmbedReport(
        output, total, embedded, len(shards), len(shards) - len(todo), len(bad), longer, time.perf_counter() - start
    )


def main(
    argv: list[str] | None = None, prog: str | None = None, worker: type[ShardWorker] = ShardWorker
) -> EmbedReport:
    help_text = "\n\n".join(__doc__.split("\n\n")[:2])  # the usage lines, not the notes below them
    report = embed_corpus(parse_options(EmbedOptions, argv, help_text, prog), worker)
    rate = report.rows / report.seconds if report.seconds else float("nan")
    print(
        f"embedded {report.embedded} of {report.rows} rows into {report.shards} shards under {report.output} "
        f"({report.resumed_shards} shards done before this run; {rate:.0f} rows/s); every id appears once; "
        f"{report.longer_than_model} texts longer than the model reads were embedded from their first tokens"
    )
    if report.bad_rows:
        raise UsageError(
            f"{report.bad_rows} bad rows (no id, or an empty text) were not embedded: {report.output / BAD_ROWS_FILE}"
        )
    return report


if __name__ == "__main__":
    run_cli(main)
