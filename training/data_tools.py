"""Data tools for contrastive training sets in JSONL (`anchor`, `positive`[, `negative`]).

    moe-embed mine   pairs.jsonl --model MODEL --output triplets.jsonl [--margin 0.95]
    moe-embed filter pairs.jsonl --model MODEL --output kept.jsonl [--top-k 20] [--address auto]

(`python -m moe_embed.training.data_tools mine|filter ...` is the same command.) Both embed through `moe-embed embed`
(`training/embed.py`: Ray Data, on this machine or a cluster with `--address`): the anchors with the model's
`query` prompt, each distinct positive text once with its `document` (or `passage`) prompt, where the model
defines them. The embeddings go to `--work-dir` (a temporary folder by default; a given one lets a stopped run
resume), and the search is faiss's exact inner-product index over the normalised positives, queried a shard of
anchors at a time: no similarity matrix, and no more than one shard of anchors in memory beside the index.

`mine`: positive-aware hard-negative mining (MoTE paper eq. 5, NV-Retriever): for each anchor, the
`--range-max` positives of the dataset most similar to it (other than the anchor's own positives) are
candidates, and a candidate is kept as a negative only if its score is below `margin` × the positive's score,
which keeps false negatives out; the best `--num-negatives` are kept.

`filter`: consistency filtering (Nomic Embed, E5): a pair is kept only if its positive ranks in the top-k of
the dataset's distinct positive texts for its anchor under a teacher model (an exact duplicate of its own
positive ties with it and is not ranked above it; scores within 1e-6 of its own count as ties).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from moe_embed.errors import UsageError, run_cli
from moe_embed.files import atomic_write_text
from moe_embed.folders import check_output
from moe_embed.options import command_parser, option, parse, parse_options
from moe_embed.training.embed import BAD_ROWS_FILE, RayOptions

TIE = 1e-6  # scores this close to a pair's own count as ties (faiss and numpy round differently)
CHUNK = 4096  # anchors searched at a time


def read_pairs(path: Path) -> list[dict]:
    """Rows of a JSONL file, each with a non-empty `anchor` and `positive`."""
    if not path.is_file():
        raise UsageError(f"input file {path} not found")
    rows = []
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise UsageError(f"{path}:{number} is not valid JSON") from None
            if not isinstance(row, dict) or "anchor" not in row or "positive" not in row:
                raise UsageError(f"{path}:{number} lacks `anchor` or `positive`")
            if not all(isinstance(row[key], str) and row[key].strip() for key in ("anchor", "positive")):
                raise UsageError(f"{path}:{number} has an empty `anchor` or `positive`")
            rows.append(row)
    if not rows:
        raise UsageError(f"{path} holds no rows")
    return rows


def write_rows(path: Path, rows: list[dict], overwrite: bool) -> None:
    """Write JSONL atomically; refuse an existing file without `overwrite`."""
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), overwrite)


def embed_texts(texts: list[str], name: str, task: str | None, options, work: Path) -> Iterator[np.ndarray]:
    """Embed `texts` with `moe-embed embed` into `work/name/` and yield their L2-normalised float32 vectors, one
    shard at a time, in order. `options`: the `EmbedOptions` of the job (model, Ray settings)."""
    import pyarrow.parquet as pq

    from moe_embed.training.embed import embed_corpus

    corpus = work / f"{name}.jsonl"
    text = "".join(json.dumps({"id": str(i), "text": t}) + "\n" for i, t in enumerate(texts))
    # rewritten only when it changed: the same command on the same --work-dir resumes, other pairs are another job
    if not corpus.is_file() or corpus.read_text(encoding="utf-8") != text:
        atomic_write_text(corpus, text, overwrite=True)
    output = work / name
    report = embed_corpus(options.__class__(**{**vars(options), "input": str(corpus), "output": output, "task": task}))
    if report.bad_rows:  # read_pairs refuses empty texts, so this is a model that failed on a row
        raise UsageError(f"{report.bad_rows} {name} were not embedded: {output / BAD_ROWS_FILE}")
    seen = 0
    for shard in sorted(output.glob("part-*.parquet")):
        table = pq.read_table(shard)
        ids = table.column("id").to_pylist()
        if ids != [str(i) for i in range(seen, seen + len(ids))]:
            raise UsageError(f"{shard} does not hold rows {seen}.. of {corpus} in order; delete {work} and rerun")
        seen += len(ids)
        # the fixed-size list column as one float32 buffer, not a Python list per row
        vectors = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(len(ids), -1)
        yield vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def positive_index(vectors: Iterator[np.ndarray]):
    """faiss's exact inner-product index over the normalised positives, filled a shard at a time."""
    import faiss

    index = None
    for chunk in vectors:
        index = index or faiss.IndexFlatIP(chunk.shape[1])
        index.add(chunk)
    return index


def chunks(vectors: Iterator[np.ndarray], size: int = CHUNK) -> Iterator[tuple[int, np.ndarray]]:
    """`(first row, vectors)` of at most `size` rows, from shards of any size."""
    start, pending = 0, []
    for shard in vectors:
        pending.append(shard)
        while sum(len(p) for p in pending) >= size:
            joined = np.concatenate(pending)
            yield start, joined[:size]
            start, pending = start + size, [joined[size:]]
    if pending and sum(len(p) for p in pending):
        yield start, np.concatenate(pending)


def consistency_keep(anchors: Iterator[np.ndarray], index, own: np.ndarray, top_k: int) -> np.ndarray:
    """Per anchor, whether fewer than `top_k` distinct positives score above its own positive (column `own`)."""
    keep = np.zeros(len(own), dtype=bool)
    k = min(top_k, index.ntotal)
    for start, queries in chunks(anchors):
        columns = own[start : start + len(queries)]
        own_scores = (queries * index.reconstruct_batch(columns)).sum(axis=1)
        scores, _ = index.search(queries, k)
        # the k-th best is at most the pair's own: at most k - 1 positives above it
        keep[start : start + len(queries)] = (k < top_k) | (scores[:, k - 1] <= own_scores + TIE)
    return keep


def mine_negatives(anchors, index, own: np.ndarray, excluded: list[set], margin: float, count: int, range_max: int):
    """Per anchor, the columns of its hard negatives: of the `range_max` best positives other than `excluded`
    (its anchor's own positives), those scoring below `margin` × its own positive's score, the best `count`."""
    result = []
    for start, queries in chunks(anchors):
        columns = own[start : start + len(queries)]
        own_scores = (queries * index.reconstruct_batch(columns)).sum(axis=1)
        widest = max(len(excluded[start + r]) for r in range(len(queries)))
        scores, found = index.search(queries, min(range_max + widest, index.ntotal))
        for r in range(len(queries)):
            candidates = [
                (j, s) for j, s in zip(found[r], scores[r], strict=True) if j >= 0 and j not in excluded[start + r]
            ]
            below = [int(j) for j, s in candidates[:range_max] if s < margin * own_scores[r]]
            result.append(below[:count])
    return result


def run_search(command: str, rows: list[dict], args, options, work: Path) -> list[dict]:
    """Embed the pairs through `moe-embed embed`, then filter them or mine their negatives."""
    from moe_embed.training.embedders import folder_prompts, prompt_name

    distinct = list(dict.fromkeys(r["positive"] for r in rows))  # each positive text embedded once
    column = {text: i for i, text in enumerate(distinct)}
    own = np.array([column[r["positive"]] for r in rows], dtype=np.int64)
    prompts = folder_prompts(Path(options.model))
    query, document = prompt_name(prompts, "query"), prompt_name(prompts, "document", "passage")
    index = positive_index(embed_texts(distinct, "positives", document, options, work))
    anchors = embed_texts([r["anchor"] for r in rows], "anchors", query, options, work)
    if command == "filter":
        keep = consistency_keep(anchors, index, own, args.top_k)
        return [row for row, kept in zip(rows, keep, strict=True) if kept]
    positives_of: dict[str, set] = {}
    for row in rows:
        positives_of.setdefault(row["anchor"], set()).add(column[row["positive"]])
    excluded = [positives_of[r["anchor"]] for r in rows]
    negatives = mine_negatives(anchors, index, own, excluded, args.margin, args.num_negatives, args.range_max)
    return [
        {"anchor": row["anchor"], "positive": row["positive"], "negative": distinct[j]}
        for row, found in zip(rows, negatives, strict=True)
        for j in found
    ]


COMMANDS = {"mine": "mine hard negatives", "filter": "consistency-filter pairs"}


@dataclass
class PairsOptions(RayOptions):
    """The options `mine` and `filter` share (their `--help` is generated from the fields), then each one's."""

    input: str = option(required=True, positional=True, help="JSONL with `anchor` and `positive`")
    model: str = option(required=True, help="embedding model (folder or Hub id) used as the teacher")
    output: str = option(required=True, help="JSONL to write")
    overwrite: bool = option(False, help="replace --output if it exists")
    batch_size: int = option(64, help="encoding batch size")
    trust_remote_code: bool = option(False, help="allow the model folder's own code")
    work_dir: str | None = option(help="where the embeddings go (default: a temporary folder; a given one resumes)")


@dataclass
class MineOptions(PairsOptions):
    margin: float = option(0.95, help="keep negatives scoring below margin x positive")
    num_negatives: int = option(1, help="negatives per pair")
    range_max: int = option(50, help="candidates considered per anchor")

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.margin <= 1:
            raise UsageError(f"--margin must lie in (0, 1], got {self.margin}")


@dataclass
class FilterOptions(PairsOptions):
    top_k: int = option(20, help="keep pairs whose positive ranks in the top-k")

    def __post_init__(self):
        super().__post_init__()
        if self.top_k < 1:
            raise UsageError(f"--top-k must be at least 1, got {self.top_k}")


OPTIONS = {"mine": MineOptions, "filter": FilterOptions}


def run(command: str, argv: list[str] | None = None, prog: str | None = None) -> Path:
    """`moe-embed mine` / `moe-embed filter` with the arguments `argv`; returns the written file."""
    from moe_embed.training.embed import EmbedOptions, require
    from moe_embed.training.embedders import check_model

    args = parse_options(OPTIONS[command], argv, __doc__, prog)
    require("ray", "faiss")
    rows = read_pairs(Path(args.input))
    output = check_output(args.output, overwrite=args.overwrite)  # before loading the model
    model = check_model(args.model, None, None, args.trust_remote_code)
    options = EmbedOptions(
        model,
        "",
        "",
        batch_size=args.batch_size,
        trust_remote_code=args.trust_remote_code,
        overwrite=args.overwrite,
        **args.ray_options(),
    )
    with tempfile.TemporaryDirectory(prefix="moe-embed-") as temporary:
        work = Path(args.work_dir or temporary)
        work.mkdir(parents=True, exist_ok=True)
        result = run_search(command, rows, args, options, work)
    write_rows(output, result, args.overwrite)
    print(f"{command}: {len(rows)} rows in, {len(result)} rows out -> {output}")
    return output


def main_mine(argv: list[str] | None = None, prog: str | None = None) -> Path:
    """`moe-embed mine ...`."""
    return run("mine", argv, prog)


def main_filter(argv: list[str] | None = None, prog: str | None = None) -> Path:
    """`moe-embed filter ...`."""
    return run("filter", argv, prog)


def main(argv: list[str] | None = None, prog: str | None = None) -> Path:
    """`python -m moe_embed.training.data_tools mine|filter ...`."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = command_parser(__doc__, prog)
        parser.add_argument(
            "command", choices=list(COMMANDS), help=", or ".join(f"{k}: {v}" for k, v in COMMANDS.items())
        )
        parse(parser, argv[:1])  # prints the usage (or the help) and exits
    return run(argv[0], argv[1:], f"{prog or 'python -m moe_embed.training.data_tools'} {argv[0]}")


if __name__ == "__main__":
    run_cli(main)
