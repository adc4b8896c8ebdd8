"""`moe-embed embed` (`training/embed.py`): a corpus embedded on Ray Data gives what `encode` gives, every row
once, after stops, dead actors and raised errors; bad rows and bad input are named; the `--address` path runs on
a cluster of two nodes simulated on this machine."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import REPO, run_main
from sentence_transformers import SentenceTransformer

from moe_embed.convert.cpu_graph import serving_file
from moe_embed.training.embed import JOB_FILE, EmbedOptions, ShardWorker, embed_corpus
from moe_embed.training.embed import main as embed_main

TEXTS = [
    "Isaac Newton formulated the laws of motion.",
    "cats",
    "how do plants make energy?",
    "The quarterly report shows revenue grew by twelve percent compared to last year.",
    "A man is playing a guitar on a stage.",
    "stocks fell",
    "Photosynthesis turns light into chemical energy in the chloroplasts of plant cells.",
    "what is the capital of France",
    "The cat sat on the mat.",
    "Rain is expected over the weekend in most of the north.",
    "two",
]
LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 40)  # over any model's max_seq_length here


@pytest.fixture(autouse=True)
def local_ray(ray_session):
    """The jobs run on the session's local Ray (the cluster test starts its own, in another process)."""


def write_corpus(path: Path, texts: list[str], ids=None) -> Path:
    ids = [f"doc-{i}" for i in range(len(texts))] if ids is None else ids
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in zip(ids, texts, strict=True)))
    return path


def read_output(folder: Path) -> dict[str, np.ndarray]:
    """id -> embedding over every shard of the output."""
    rows = {}
    for shard in sorted(folder.glob("part-*.parquet")):
        table = pq.read_table(shard)
        for id_, vector in zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), strict=True):
            assert id_ not in rows
            rows[id_] = np.asarray(vector, dtype=np.float32)
    return rows


def embed(model, corpus, output, worker=ShardWorker, **options):
    options = {"trust_remote_code": True, "rows_per_shard": 4, "batch_size": 3, **options}
    return embed_corpus(EmbedOptions(model=str(model), input=str(corpus), output=output, **options), worker)


def failing_once(how: str, marker: Path) -> type[ShardWorker]:
    """A worker whose first try at a shard, across actors, dies (the process exits) or raises before writing: the
    first to create `marker`. Defined here, so Ray sends the class itself to the actors."""

    class FailingOnce(ShardWorker):
        def embed(self, shard):
            try:
                marker.touch(exist_ok=False)
            except FileExistsError:
                return super().embed(shard)
            if how == "exit":
                os._exit(1)
            raise RuntimeError("a fault the test injected")

    return FailingOnce


# `moe-embed embed` in a process of its own whose workers fail on shard `sys.argv[2]` every time: they die (exit)
# or raise (`sys.argv[1]`); the class is defined in `__main__`, so Ray sends it to the actors
ALWAYS_FAILING_JOB = """
import os, sys
from moe_embed.training.embed import ShardWorker, main
from moe_embed.errors import run_cli

how, index = sys.argv[1], int(sys.argv[2])


class AlwaysFailing(ShardWorker):
    def embed(self, shard):
        if shard.index != index:
            return super().embed(shard)
        if how == "exit":
            os._exit(1)
        raise RuntimeError("a fault the test injected")


run_cli(lambda argv: main(argv, worker=AlwaysFailing), sys.argv[3:])
"""


@pytest.fixture(scope="module")
def aea_dir(dense_path, tmp_path_factory) -> str:
    """AEA calibrated on a token-routed MoE whose experts differ (upcycled with expert noise)."""
    from moe_embed.convert.calibrate_aea import main as calibrate_main
    from moe_embed.convert.upcycle import main as upcycle_main

    work = tmp_path_factory.mktemp("aea")
    moe = ["--base", dense_path, "--arch", "moe", "--num-local-experts", "4", "--expert-noise", "0.05"]
    upcycle_main([*moe, "--output", str(work / "moe")])
    (work / "texts.txt").write_text("\n".join(TEXTS) + "\n")
    calibrate_main([str(work / "moe"), "--output", str(work / "aea"), "--calibration", str(work / "texts.txt")])
    return str(work / "aea")


@pytest.mark.parametrize(
    "family, task",
    [
        (
            "mote",
            "document",
        ),  # the contributor's lane runs one job of each kind of Ray work; the full lane every family
        *[
            pytest.param(*case, marks=pytest.mark.slow)
            for case in [
                ("mote", "query"),
                ("mote", None),
                ("moe", "query"),
                ("comoe", None),
                ("aea", None),
                ("dense", None),
                ("mote-onnx", "query"),
            ]
        ],
    ],
)
def test_ray_job_embeds_as_encode(family, task, request, tmp_path):
    fixture = {"mote": "trained_mote", "mote-onnx": "mote_onnx", "dense": "dense_path"}.get(family, f"{family}_dir")
    model = request.getfixturevalue(fixture)
    corpus = write_corpus(tmp_path / "corpus.jsonl", [*TEXTS, LONG])
    report = embed(model, corpus, tmp_path / "out", task=task)
    assert (report.rows, report.embedded, report.shards, report.bad_rows) == (12, 12, 3, 0)
    got = read_output(tmp_path / "out")
    reference = request.getfixturevalue("trained_mote") if family == "mote-onnx" else model
    st = SentenceTransformer(str(reference), trust_remote_code=True)
    assert report.longer_than_model == int(len(st.tokenizer(LONG)["input_ids"]) > st.max_seq_length)
    expected = st.encode([*TEXTS, LONG], **({"prompt_name": task} if task else {}))
    vectors = np.stack([got[f"doc-{i}"] for i in range(12)])
    if family == "mote-onnx":  # the graph for this CPU, chosen once for every worker: fp32 (1e-4) or int8
        graph = json.loads((tmp_path / "out" / JOB_FILE).read_text())["onnx_file"]
        assert graph == serving_file(model)[0]
        variants = json.loads((model / "onnx_config.json").read_text())["int8"]["variants"]
        # int8 quantises each batch's activations with one scale: the job's batches are not the export's, so the
        # recorded agreement is a guide, with room for batching, not a bound to the last digit
        bound = {v["file"]: v["min_cosine"] - 0.01 for v in variants.values()}.get(graph)
        cosines = (vectors * expected).sum(1) / np.linalg.norm(vectors, axis=1) / np.linalg.norm(expected, axis=1)
        assert np.abs(vectors - expected).max() <= 1e-4 if bound is None else cosines.min() >= bound
    else:
        assert np.abs(vectors - expected).max() <= 1e-5
    tasks = {t for shard in (tmp_path / "out").glob("part-*.parquet") for t in pq.read_table(shard)["task"].to_pylist()}
    assert tasks == {task}


@pytest.mark.parametrize("fixture, task", [("dense_path", None), ("mote_onnx", "query")])
def test_texts_longer_than_the_model_are_counted_at_the_boundary(fixture, task, request):
    """Texts of the model's length less one, the length, and one more (prompt and special tokens included): only
    the last is counted, as the model's own tokenizer counts it; counting leaves the model's tokenizer truncating."""
    from transformers import AutoTokenizer

    from moe_embed.training.embedders import Embedder

    model = str(request.getfixturevalue(fixture))
    embedder = Embedder(model, task, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(model)
    budget = embedder.max_tokens - len(tokenizer(embedder.prompt)["input_ids"])  # tokens left for the text
    texts = [" ".join(["the"] * (budget + extra)) for extra in (-1, 0, 1)]  # one token a word
    lengths = [len(tokenizer(embedder.prompt + text)["input_ids"]) for text in texts]
    assert lengths == [embedder.max_tokens - 1, embedder.max_tokens, embedder.max_tokens + 1]
    assert embedder.longer_than_model(texts) == 1
    assert embedder.longer_than_model(texts[:2]) == 0
    vectors = embedder(texts[1:], 2)  # the model still reads the first max_tokens tokens: both texts embed alike
    assert np.abs(vectors[0] - vectors[1]).max() <= 1e-4


@pytest.mark.slow
def test_parquet_and_a_folder_of_files_are_read_whole_across_shards(dense_path, tmp_path):
    """Shards that cut through Parquet row groups, and a folder of two JSON-lines files, give every row once."""
    import pyarrow as pa

    ids = [f"doc-{i}" for i in range(len(TEXTS))]
    parquet = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"key": ids, "body": TEXTS}), parquet, row_group_size=3)  # groups of 3, shards of 4
    folder = tmp_path / "parts"
    folder.mkdir()
    write_corpus(folder / "a.jsonl", TEXTS[:5], ids[:5])
    write_corpus(folder / "b.jsonl", TEXTS[5:], ids[5:])
    expected = SentenceTransformer(dense_path).encode(TEXTS)
    for corpus, columns in ((parquet, {"id_column": "key", "text_column": "body"}), (folder, {})):
        output = tmp_path / f"out-{corpus.name}"
        report = embed(dense_path, corpus, output, **columns)
        assert report.embedded == len(TEXTS)
        got = read_output(output)
        assert np.abs(np.stack([got[i] for i in ids]) - expected).max() <= 1e-5
        # each shard records how long its embedding took: part of the job's time, more than nothing
        seconds = [json.loads(p.read_text())["embed_seconds"] for p in output.glob("_part-*.json")]
        assert len(seconds) == report.shards and all(0 < s <= report.seconds for s in seconds)


@pytest.mark.slow
def test_job_leaves_the_callers_ray_data_settings_alone(dense_path, tmp_path):
    """The job's own settings (no Ray Data progress bars, wait for every actor) go on its dataset, not on the
    process-wide `DataContext` of a caller that runs Ray Data itself."""
    import ray

    context = ray.data.DataContext.get_current()
    before = (context.enable_progress_bars, context.wait_for_min_actors_s)
    report = embed(dense_path, write_corpus(tmp_path / "corpus.jsonl", TEXTS), tmp_path / "out")
    assert report.embedded == len(TEXTS)
    context = ray.data.DataContext.get_current()
    assert (context.enable_progress_bars, context.wait_for_min_actors_s) == before


@pytest.mark.slow
def test_stopped_job_resumes_to_the_one_process_result(trained_mote, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS)
    output = tmp_path / "out"
    first = embed(trained_mote, corpus, output, task="document")
    kept = pq.read_table(output / "part-000000.parquet")
    # a stop after shard 0 and during shard 1: shard 2's file and shard 1's never written, a temporary left over
    (output / "part-000001.parquet").unlink()
    (output / "part-000002.parquet").unlink()
    (output / ".part-000001.parquet.tmp-x").write_bytes(b"half a file")
    again = embed(trained_mote, corpus, output, task="document")
    assert (first.resumed_shards, again.resumed_shards, again.embedded) == (0, 1, len(TEXTS))
    assert pq.read_table(output / "part-000000.parquet").equals(kept)  # done shards are not redone
    expected = SentenceTransformer(str(trained_mote), trust_remote_code=True).encode(TEXTS, prompt_name="document")
    got = read_output(output)
    assert np.abs(np.stack([got[f"doc-{i}"] for i in range(len(TEXTS))]) - expected).max() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("fault", ["exit", "raise"])
def test_actor_that_dies_or_raises_is_retried_to_an_exact_result(fault, trained_mote, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS)
    marker = tmp_path / "fault-happened"
    report = embed(trained_mote, corpus, tmp_path / "out", failing_once(fault, marker), task="query")
    assert marker.exists()  # one shard's worker did die (or raise) once
    assert (report.embedded, report.resumed_shards) == (len(TEXTS), 0)
    expected = SentenceTransformer(str(trained_mote), trust_remote_code=True).encode(TEXTS, prompt_name="query")
    got = read_output(tmp_path / "out")
    assert np.abs(np.stack([got[f"doc-{i}"] for i in range(len(TEXTS))]) - expected).max() <= 1e-5


@pytest.mark.slow
@pytest.mark.parametrize("fault, message", [("exit", "a worker died 2 times"), ("raise", "shard 1 failed 2 times")])
def test_shard_that_always_fails_ends_the_job_and_the_rest_resumes(fault, message, dense_path, tmp_path):
    """A shard that kills its worker (or raises) on every try ends the job after `--max-retries`, in one line,
    instead of being retried forever; the shards written are kept, and the same command resumes from them. The
    failing job is the command in a process of its own: its actors end with it, as a failed command's do."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS)
    args = [dense_path, str(corpus), "--output", str(tmp_path / "out"), "--rows-per-shard", "4", "--max-retries", "1"]
    command = [sys.executable, "-c", ALWAYS_FAILING_JOB, fault, "1", *args]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=600)
    assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1], done.stderr[-3000:]
    written = sorted(p.name for p in (tmp_path / "out").glob("part-*.parquet"))  # those that ran before shard 1
    assert "part-000001.parquet" not in written
    report = embed(dense_path, corpus, tmp_path / "out", rows_per_shard=4)  # the same job, the fault gone
    assert (report.resumed_shards, report.embedded) == (len(written), len(TEXTS))
    got = read_output(tmp_path / "out")
    expected = SentenceTransformer(dense_path).encode(TEXTS)
    assert np.abs(np.stack([got[f"doc-{i}"] for i in range(len(TEXTS))]) - expected).max() <= 1e-5


def test_bad_rows_are_counted_listed_and_exit_2(dense_path, tmp_path, capsys):
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"id": "a", "text": "fine"}, {"text": "no id"}, {"id": "b", "text": "  "}, {"id": "c", "text": LONG}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n" + "not json\n")
    code, err = run_main(embed_main, dense_path, str(corpus), "--output", str(tmp_path / "out"), capsys=capsys)
    assert code == 2 and "3 bad rows" in err.strip().splitlines()[-1], err
    bad = [json.loads(line) for line in (tmp_path / "out" / "_bad_rows.jsonl").read_text().splitlines()]
    assert [(b["row"], b["id"], b["reason"]) for b in bad] == [
        (1, None, "missing id"),
        (2, "b", "empty text"),
        (4, None, "missing id"),
    ]
    assert sorted(read_output(tmp_path / "out")) == ["a", "c"]  # the good rows are all there, the long one too
    # the folder, its JSON files beside the shards, reads as one Parquet dataset (docs/embedding.md's read-back)
    import pandas as pd

    assert sorted(pq.read_table(tmp_path / "out").column("id").to_pylist()) == ["a", "c"]
    assert sorted(pd.read_parquet(tmp_path / "out")["id"]) == ["a", "c"]


# the check's default; its ids spilled to 8 buckets
@pytest.mark.parametrize("memory_mib", [pytest.param(None, marks=pytest.mark.slow), 1e-5])
def test_duplicated_ids_fail_naming_them(memory_mib, dense_path, tmp_path, capsys, monkeypatch):
    if memory_mib:
        monkeypatch.setattr("moe_embed.training.embed.ID_CHECK_MIB", memory_mib)
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS[:6], ids=["x", "y", "z", "y", "w", "x"])
    args = [str(corpus), "--output", str(tmp_path / "out"), "--rows-per-shard", "2"]  # copies in other shards
    code, err = run_main(embed_main, dense_path, *args, capsys=capsys)
    assert (
        code == 2 and "the input repeats 2 ids: x, y (each row needs an id of its own" in err.strip().splitlines()[-1]
    ), err
    assert not (tmp_path / "out").exists()  # refused before any shard was embedded


def test_ids_repeated_in_other_types_are_one_id(dense_path, tmp_path, capsys):
    """An id is the string the output holds: 1 and "1" in a JSONL input are the same id, refused up front."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in [(1, "one"), ("1", "uno"), (2, "two")])
    )
    code, err = run_main(embed_main, dense_path, str(corpus), "--output", str(tmp_path / "out"), capsys=capsys)
    assert code == 2 and "the input repeats 1 ids: 1 (" in err.strip().splitlines()[-1], err
    assert not (tmp_path / "out").exists()  # refused before any shard was embedded


def test_repeated_ids_are_found_in_any_memory():
    """The id check finds the same repeated hashes whether it holds them all or spills them to buckets on disk,
    with copies in different batches and hashes spread over the whole 64-bit range."""
    from moe_embed.training.embed import repeated_hashes

    rng = np.random.default_rng(0)
    unique = rng.permutation(np.unique(rng.integers(0, 2**64 - 1, size=4000, dtype=np.uint64)))
    assert len(unique) == 4000
    planted = unique[[3, 1500, 3999]]  # each appears again, in a later batch
    batches = [unique[:2000], np.concatenate([unique[2000:], planted[:1]]), planted[1:], planted[2:]]
    rows = sum(len(b) for b in batches)
    for memory_mib in (1.0, 0.01, 0.001, 1e-6):  # 1, 4, 64 and 1024 buckets
        assert repeated_hashes(iter(batches), rows, memory_mib) == set(planted.tolist())
    assert repeated_hashes(iter([unique]), len(unique), 1e-6) == set()


@pytest.mark.parametrize(
    "case, message",
    [
        ("missing", "is not a .jsonl or .parquet file"),
        ("text-file", "is neither JSON lines (.jsonl) nor Parquet (.parquet)"),
        ("no-column", "has no column 'text'; its columns are ['body', 'id']"),
        ("not-json", "corpus.jsonl:1 is not valid JSON"),
        ("bad-parquet", "is not a readable Parquet file"),
        ("unknown-task", "has no prompt 'legal' for --task"),
        pytest.param("another-job", "holds another job's shards; pass --overwrite", marks=pytest.mark.slow),
        ("remote-code", "pass --trust-remote-code to allow it"),
        ("batch-size", "--batch-size must be at least 1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(case, message, trained_mote, dense_path, tmp_path, capsys):
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS[:2])
    model, extra = dense_path, []
    if case == "missing":
        corpus = tmp_path / "nowhere.jsonl.gz"
    elif case == "text-file":
        corpus = tmp_path / "corpus.txt"
        corpus.write_text("hello\n")
    elif case == "no-column":
        corpus.write_text(json.dumps({"id": 1, "body": "x"}) + "\n")
    elif case == "not-json":
        corpus.write_text("{oops\n")
    elif case == "bad-parquet":
        corpus = tmp_path / "corpus.parquet"
        corpus.write_bytes(b"PAR1 not really")
    elif case == "unknown-task":
        model, extra = str(trained_mote), ["--task", "legal", "--trust-remote-code"]
    elif case == "another-job":
        run_main(embed_main, dense_path, str(corpus), "--output", str(tmp_path / "out"), capsys=capsys)
        extra = ["--rows-per-shard", "7"]
    elif case == "remote-code":
        model = str(trained_mote)
    elif case == "batch-size":
        extra = ["--batch-size", "0"]
    code, err = run_main(embed_main, model, str(corpus), "--output", str(tmp_path / "out"), *extra, capsys=capsys)
    assert code == 2 and message in err.strip().splitlines()[-1], err
    if case != "another-job":
        assert not (tmp_path / "out").exists()


# `moe-embed embed` whose first actor to start waits 15 s before it loads the model, as on a busy node
SLOW_START_JOB = """
import sys, time
from pathlib import Path
from moe_embed.training.embed import ShardWorker, main
from moe_embed.errors import run_cli

marker = Path(sys.argv[1])


class SlowStart(ShardWorker):
    def __init__(self, *args, **kwargs):
        try:
            marker.touch(exist_ok=False)
            time.sleep(15)
        except FileExistsError:
            pass
        super().__init__(*args, **kwargs)


run_cli(lambda argv: main(argv, worker=SlowStart), sys.argv[2:])
"""

CLUSTER_JOB = """
import json, subprocess, sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
try:
    done = subprocess.run(
        [sys.executable, "-c", sys.argv[1], *sys.argv[2:], "--address", cluster.address],
        capture_output=True, text=True, timeout=600,
    )
    print(json.dumps({"code": done.returncode, "out": done.stdout, "err": done.stderr[-2000:]}))
finally:
    cluster.shutdown()
"""


OWN_RAY_JOB = """
import json, subprocess, sys
from ray.cluster_utils import Cluster

cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
try:  # a Ray already running on this machine (a notebook's, another job's): the job must not join it
    command = [sys.executable, "-m", "moe_embed.training.embed", *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True)
    nodes = [node.node_id for node in cluster.list_all_nodes()]
    print(json.dumps({"code": done.returncode, "err": done.stderr[-2000:], "nodes": nodes}))
finally:
    cluster.shutdown()
"""


@pytest.mark.slow
def test_a_job_without_address_runs_on_a_ray_of_its_own(dense_path, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS[:4])
    args = [dense_path, str(corpus), "--output", str(tmp_path / "out")]
    done = subprocess.run([sys.executable, "-c", OWN_RAY_JOB, *args], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, result["err"]
    # a run that works says what it did and nothing of Ray's (its notes, deprecations, the core worker's E line, the
    # line its log level costs), not even after the progress bar on the bar's own line
    lines = [line for line in result["err"].replace("\r", "\n").splitlines() if line.strip()]
    assert lines and all(line.startswith(("embed:", "1 actors of")) for line in lines), lines
    ray_lines = re.findall(
        r"\[\d{4}-\d\d-\d\d [\d:,]+ [DIWEF] \d+ \d+\] \S+\.cc:\d+", result["err"]
    )  # Ray's C++ log lines
    assert ray_lines == [] and "RAY_BACKEND_LOG_LEVEL" not in result["err"], result["err"]
    [summary] = [json.loads(p.read_text()) for p in (tmp_path / "out").glob("_part-*.json")]
    assert result["nodes"] and summary["node"] not in result["nodes"]


@pytest.mark.slow
def test_address_runs_the_job_on_a_cluster_of_two_nodes(dense_path, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.jsonl", TEXTS * 2, ids=[f"d{i}" for i in range(2 * len(TEXTS))])
    output = tmp_path / "out"
    args = [dense_path, str(corpus), "--output", str(output), "--rows-per-shard", "2", "--batch-size", "2"]
    # one actor starts 15 s late, as on a busy node: the other must not take every shard meanwhile
    job = [SLOW_START_JOB, str(tmp_path / "slow-start-happened"), *args]
    done = subprocess.run(
        [sys.executable, "-c", CLUSTER_JOB, *job], capture_output=True, text=True, cwd=REPO, timeout=900
    )
    assert (tmp_path / "slow-start-happened").exists()
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, result["err"]
    assert "every id appears once" in result["out"] and "(0 shards done before this run;" in result["out"]
    nodes = {json.loads(p.read_text())["node"] for p in output.glob("_part-*.json")}
    assert len(nodes) == 2  # one actor on each node (the default: one per node, all its CPUs)
    expected = SentenceTransformer(dense_path).encode(TEXTS)
    got = read_output(output)
    assert np.abs(np.stack([got[f"d{i}"] for i in range(len(TEXTS))]) - expected).max() <= 1e-5
