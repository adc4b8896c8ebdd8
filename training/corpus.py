"""A corpus cut into shards that any machine can read on its own: the unit of work (and of exactly-once) of
`moe-embed embed` (`training/embed.py`).

A corpus is a JSON-lines file, a Parquet file, a folder of either (files in name order), or a Hub dataset
(`datasets.load_dataset(NAME, split=...)`, or a folder `datasets` saved). `plan_shards` cuts it into row
ranges of `rows_per_shard` rows, always the same for the same input: a JSON-lines shard is a byte offset and a
row count (one pass over the file finds the offsets; blank lines are not rows), a Parquet shard a row range of
one file (from its footer), a Hub shard a row range of the loaded split. `read_shard` reads one shard's ids and
texts where it runs, so the corpus streams: no process holds more than a shard of it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from moe_embed.errors import UsageError

FORMATS = {".jsonl": "jsonl", ".json": "jsonl", ".parquet": "parquet"}


@dataclass(frozen=True)
class Shard:
    """Rows `start .. start + rows` of one source (`kind`: jsonl, parquet or hub); `offset`: a JSON-lines
    shard's first byte."""

    index: int
    kind: str
    source: str
    start: int
    rows: int
    offset: int = 0
    split: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Corpus:
    """Where a corpus is and which of its columns hold the ids and the texts."""

    source: str
    id_column: str = "id"
    text_column: str = "text"
    split: str = "train"

    def files(self) -> list[Path]:
        """The local files of the corpus, in order; `[]` for a Hub dataset (or a saved `datasets` folder)."""
        path = Path(self.source)
        if path.is_file():
            if path.suffix not in FORMATS:
                raise UsageError(f"{path} is neither JSON lines (.jsonl) nor Parquet (.parquet)")
            return [path]
        if path.is_dir() and not (path / "dataset_info.json").is_file() and not (path / "state.json").is_file():
            files = sorted(p for p in path.iterdir() if p.suffix in FORMATS and p.is_file())
            kinds = {FORMATS[p.suffix] for p in files}
            if not files or len(kinds) > 1:
                found = "none" if not files else "both"
                raise UsageError(f"{path} must hold .jsonl or .parquet files (one kind); found {found}")
            return files
        return []

    def fingerprint(self) -> list:
        """What identifies the input of a job: each file's name, size and modification time, or the dataset."""
        files = self.files()
        if not files:
            return [self.source, self.split]
        return [[str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns] for p in files]


def plan_shards(corpus: Corpus, rows_per_shard: int) -> list[Shard]:
    """The corpus's shards, in order; checks that the id and text columns exist (a one-line `UsageError`)."""
    if rows_per_shard < 1:
        raise UsageError(f"--rows-per-shard must be at least 1, got {rows_per_shard}")
    files = corpus.files()
    if not files:
        return _hub_shards(corpus, rows_per_shard)
    shards: list[Shard] = []
    for path in files:
        plan = _jsonl_shards if FORMATS[path.suffix] == "jsonl" else _parquet_shards
        for kind, start, rows, offset in plan(path, corpus, rows_per_shard):
            shards.append(Shard(len(shards), kind, str(path.resolve()), start, rows, offset))
    return shards


def _require_columns(columns, corpus: Corpus, where: str) -> None:
    missing = [c for c in (corpus.id_column, corpus.text_column) if c not in columns]
    if missing:
        raise UsageError(
            f"{where} has no column {', '.join(map(repr, missing))}; its columns are {sorted(columns)} "
            "(name them with --id-column and --text-column)"
        )


def _jsonl_shards(path: Path, corpus: Corpus, rows_per_shard: int):
    """One pass over the file: the byte offset of every `rows_per_shard`-th row (blank lines are not rows)."""
    row, offset, shard_start, checked = 0, 0, 0, False
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                if not checked:  # the columns, from the first row
                    try:
                        first = json.loads(line)
                    except json.JSONDecodeError:
                        raise UsageError(f"{path}:1 is not valid JSON; expected one object per line") from None
                    if not isinstance(first, dict):
                        raise UsageError(f"{path}:1 is not a JSON object; expected one object per line")
                    _require_columns(first, corpus, str(path))
                    checked = True
                if row and row % rows_per_shard == 0:
                    yield "jsonl", row - rows_per_shard, rows_per_shard, shard_start
                    shard_start = offset
                row += 1
            offset += len(line)
    if row == 0:
        raise UsageError(f"{path} holds no rows")
    last = row - (row - 1) // rows_per_shard * rows_per_shard
    yield "jsonl", row - last, last, shard_start


def _parquet_shards(path: Path, corpus: Corpus, rows_per_shard: int):
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(path)
    except Exception as error:  # pyarrow raises its own ArrowInvalid for a file that is not Parquet
        raise UsageError(f"{path} is not a readable Parquet file ({' '.join(str(error).split())})") from None
    _require_columns(metadata.schema_arrow.names, corpus, str(path))
    total = metadata.metadata.num_rows
    if total == 0:
        raise UsageError(f"{path} holds no rows")
    for start in range(0, total, rows_per_shard):
        yield "parquet", start, min(rows_per_shard, total - start), 0


def _load_hub(source: str, split: str):
    """The split of a Hub dataset (or of a folder `datasets` saved), memory-mapped."""
    import datasets

    from moe_embed.data import one_line

    try:
        if Path(source).is_dir():
            loaded = datasets.load_from_disk(source)
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(source, split=split)
    except (KeyError, ValueError, FileNotFoundError, OSError) as error:
        hint = "" if os.environ.get("HF_HUB_OFFLINE") != "1" else " (HF_HUB_OFFLINE=1: only cached datasets load)"
        raise UsageError(
            f"{source} is not a .jsonl or .parquet file, a folder of them, nor a loadable dataset split "
            f"{split!r}{hint}: {one_line(error)}"
        ) from None


def _hub_shards(corpus: Corpus, rows_per_shard: int) -> list[Shard]:
    dataset = _load_hub(corpus.source, corpus.split)
    _require_columns(dataset.column_names, corpus, f"{corpus.source} (split {corpus.split})")
    if len(dataset) == 0:
        raise UsageError(f"{corpus.source} (split {corpus.split}) holds no rows")
    return [
        Shard(i, "hub", corpus.source, start, min(rows_per_shard, len(dataset) - start), split=corpus.split)
        for i, start in enumerate(range(0, len(dataset), rows_per_shard))
    ]


def read_shard(shard: Shard, id_column: str, text_column: str) -> tuple[list, list]:
    """The shard's ids and texts as the file holds them (`None` where a row lacks one; a row that is not a
    JSON object has neither)."""
    if shard.kind == "jsonl":
        ids, texts = [], []
        with open(shard.source, "rb") as handle:
            handle.seek(shard.offset)
            while len(ids) < shard.rows:
                line = handle.readline()
                if not line:
                    raise UsageError(f"{shard.source} is shorter than when the job was planned; start it again")
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    row = None
                row = row if isinstance(row, dict) else {}
                ids.append(row.get(id_column))
                texts.append(row.get(text_column))
        return ids, texts
    if shard.kind == "parquet":
        import pyarrow.parquet as pq

        parquet = pq.ParquetFile(shard.source)
        groups, first, seen = [], None, 0  # the row groups that hold the shard's rows, not the whole file
        for group in range(parquet.num_row_groups):
            size = parquet.metadata.row_group(group).num_rows
            if seen + size > shard.start and seen < shard.start + shard.rows:
                groups.append(group)
                first = seen if first is None else first
            seen += size
        table = parquet.read_row_groups(groups, columns=[id_column, text_column])
        table = table.slice(shard.start - first, shard.rows)
    else:
        table = _load_hub(shard.source, shard.split).select(range(shard.start, shard.start + shard.rows))
        table = table.select_columns([id_column, text_column]).data
    return table.column(id_column).to_pylist(), table.column(text_column).to_pylist()


__all__ = ["Corpus", "Shard", "plan_shards", "read_shard"]
