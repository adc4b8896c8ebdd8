"""Data tools for contrastive training sets in JSONL (`anchor`, `positive`[, `negative`]).

    python -m training.data_tools mine   pairs.jsonl --model MODEL --output triplets.jsonl [--margin 0.95]
    python -m training.data_tools filter pairs.jsonl --model MODEL --output kept.jsonl [--top-k 20]

`mine`: positive-aware hard-negative mining (MoTE paper eq. 5, NV-Retriever): for each anchor, the
most similar corpus texts (the dataset's positives) are candidates, and a candidate is kept as a
negative only if its score is below `margin` × the positive's score, which keeps false negatives
out. Done by `sentence_transformers.util.mine_hard_negatives` with `relative_margin = 1 - margin`.

`filter`: consistency filtering (Nomic Embed, E5): a pair is kept only if its positive ranks in the
top-k of the dataset's distinct positive texts for its anchor under a teacher model (an exact
duplicate of its own positive ties with it and is not ranked above it).

Models get `query`/`document` prompts when they define them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from convert.folders import load_sentence_transformer
from moe_embed_cli import HelpFormatter, UsageError, run_cli


def read_pairs(path: Path) -> list[dict]:
    """Rows of a JSONL file, each with `anchor` and `positive`."""
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
            rows.append(row)
    if not rows:
        raise UsageError(f"{path} holds no rows")
    return rows


def refuse_existing(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise UsageError(f"{path} already exists; pass --overwrite to replace it")


def write_rows(path: Path, rows: list[dict], overwrite: bool) -> None:
    """Write JSONL atomically; refuse an existing file without `overwrite`."""
    refuse_existing(path, overwrite)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
    tmp.replace(path)


def _prompt(model, names: tuple[str, ...]) -> str | None:
    return next((model.prompts[n] for n in names if n in (model.prompts or {})), None)


def mine(rows: list[dict], model, margin: float, num_negatives: int, range_max: int, batch_size: int) -> list[dict]:
    """One row per (anchor, positive, hard negative) that passes the positive-aware margin."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    if not 0 < margin <= 1:
        raise UsageError(f"--margin must lie in (0, 1], got {margin}")
    dataset = Dataset.from_dict({"anchor": [r["anchor"] for r in rows], "positive": [r["positive"] for r in rows]})
    mined = mine_hard_negatives(
        dataset,
        model,
        relative_margin=1.0 - margin,
        num_negatives=num_negatives,
        range_max=range_max,
        sampling_strategy="top",
        output_format="triplet",
        batch_size=batch_size,
        use_faiss=False,
        query_prompt=_prompt(model, ("query",)),
        corpus_prompt=_prompt(model, ("document", "passage")),
        verbose=False,
    )
    return [{"anchor": r["anchor"], "positive": r["positive"], "negative": r["negative"]} for r in mined]


def consistency_filter(rows: list[dict], model, top_k: int, batch_size: int) -> list[dict]:
    """The rows whose positive ranks in the top-k of all positives for their anchor.

    A pair's rank is the number of *distinct* positive texts that score strictly above its own
    positive. Positives are encoded once per distinct text, so an exact duplicate of a pair's
    positive (common in real data: two questions with one answer) shares its embedding, ties with
    it exactly and is never "ranked above" it, whatever the batch composition.
    """
    import torch

    if top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {top_k}")
    distinct = list(dict.fromkeys(r["positive"] for r in rows))  # first-seen order
    column = {text: i for i, text in enumerate(distinct)}
    queries = model.encode(
        [r["anchor"] for r in rows],
        prompt=_prompt(model, ("query",)),
        batch_size=batch_size,
        convert_to_tensor=True,
        normalize_embeddings=True,
    )
    docs = model.encode(
        distinct,
        prompt=_prompt(model, ("document", "passage")),
        batch_size=batch_size,
        convert_to_tensor=True,
        normalize_embeddings=True,
    )
    own_column = torch.tensor([column[r["positive"]] for r in rows])
    kept = []
    for start in range(0, len(rows), 1024):
        scores = queries[start : start + 1024] @ docs.T  # (chunk, distinct positives)
        own = scores.gather(1, own_column[start : start + scores.shape[0], None].to(scores.device))  # (chunk, 1)
        rank = (scores > own).sum(dim=1)  # distinct positives scored above this pair's own; itself never is
        kept += [rows[start + i] for i in torch.nonzero(rank < top_k).flatten().tolist()]
    return kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("command", choices=["mine", "filter"], help="mine hard negatives, or consistency-filter pairs")
    parser.add_argument("input", help="JSONL with `anchor` and `positive`")
    parser.add_argument("--model", required=True, help="embedding model (folder or Hub id) used as the teacher")
    parser.add_argument("--output", required=True, help="JSONL to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    parser.add_argument(
        "--margin", type=float, default=0.95, help="mine: keep negatives scoring below margin x positive"
    )
    parser.add_argument("--num-negatives", type=int, default=1, help="mine: negatives per pair")
    parser.add_argument("--range-max", type=int, default=50, help="mine: candidates considered per anchor")
    parser.add_argument("--top-k", type=int, default=20, help="filter: keep pairs whose positive ranks in the top-k")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the model folder's own code")
    args = parser.parse_args(argv)
    rows = read_pairs(Path(args.input))
    output = Path(args.output)
    refuse_existing(output, args.overwrite)  # before loading the model
    model = load_sentence_transformer(args.model, trust_remote_code=args.trust_remote_code)
    if args.command == "mine":
        result = mine(rows, model, args.margin, args.num_negatives, args.range_max, args.batch_size)
    else:
        result = consistency_filter(rows, model, args.top_k, args.batch_size)
    write_rows(output, result, args.overwrite)
    print(f"{args.command}: {len(rows)} rows in, {len(result)} rows out -> {output}")


if __name__ == "__main__":
    run_cli(main)
