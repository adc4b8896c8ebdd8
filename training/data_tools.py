"""Data tools for contrastive training sets in JSONL (`anchor`, `positive`[, `negative`]).

    moe-embed mine   pairs.jsonl --model MODEL --output triplets.jsonl [--margin 0.95]
    moe-embed filter pairs.jsonl --model MODEL --output kept.jsonl [--top-k 20]

(`python -m training.data_tools mine|filter ...` is the same command.)

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

import json
from pathlib import Path

from moe_embed.files import atomic_write_text
from moe_embed.folders import check_output, load_sentence_transformer
from moe_embed.usage import UsageError, command_parser, parse, run_cli


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


def write_rows(path: Path, rows: list[dict], overwrite: bool) -> None:
    """Write JSONL atomically; refuse an existing file without `overwrite`."""
    atomic_write_text(path, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), overwrite)


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


COMMANDS = {"mine": "mine hard negatives", "filter": "consistency-filter pairs"}


def build_parser(command: str, prog: str | None = None):
    """The parser of `moe-embed mine` or `moe-embed filter` (the options of the other are not offered)."""
    parser = command_parser(__doc__, prog)
    parser.add_argument("input", help="JSONL with `anchor` and `positive`")
    parser.add_argument("--model", required=True, help="embedding model (folder or Hub id) used as the teacher")
    parser.add_argument("--output", required=True, help="JSONL to write")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if it exists")
    if command == "mine":
        parser.add_argument("--margin", type=float, default=0.95, help="keep negatives scoring below margin x positive")
        parser.add_argument("--num-negatives", type=int, default=1, help="negatives per pair")
        parser.add_argument("--range-max", type=int, default=50, help="candidates considered per anchor")
    else:
        parser.add_argument("--top-k", type=int, default=20, help="keep pairs whose positive ranks in the top-k")
    parser.add_argument("--batch-size", type=int, default=64, help="encoding batch size")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow the model folder's own code")
    return parser


def run(command: str, argv: list[str] | None = None, prog: str | None = None) -> Path:
    """`moe-embed mine` / `moe-embed filter` with the arguments `argv`; returns the written file."""
    args = parse(build_parser(command, prog), argv)
    rows = read_pairs(Path(args.input))
    output = check_output(args.output, overwrite=args.overwrite)  # before loading the model
    model = load_sentence_transformer(args.model, trust_remote_code=args.trust_remote_code)
    if command == "mine":
        result = mine(rows, model, args.margin, args.num_negatives, args.range_max, args.batch_size)
    else:
        result = consistency_filter(rows, model, args.top_k, args.batch_size)
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
    """`python -m training.data_tools mine|filter ...`."""
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        parser = command_parser(__doc__, prog)
        parser.add_argument(
            "command", choices=list(COMMANDS), help=", or ".join(f"{k}: {v}" for k, v in COMMANDS.items())
        )
        parse(parser, argv[:1])  # prints the usage (or the help) and exits
    return run(argv[0], argv[1:], f"{prog or 'python -m training.data_tools'} {argv[0]}")


if __name__ == "__main__":
    run_cli(main)
