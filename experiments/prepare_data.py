"""Training data for the MoTE-vs-instructions experiment, built from the train splits in `../shared/data`.

    python -m experiments.prepare_data --output models/experiment/data [--seed 0] [--no-negatives]

The shared folder is read in its own layout (`moe_embed.readers`), from `--shared`, else `$MOE_EMBED_SHARED`,
else `../shared/data` beside the repository.

Writes one JSONL file per dataset with `anchor`, `positive` and `negative` (every dataset gets a
negative, so the static curriculum, which keeps the columns all entries share, would train on the
same rows as TA-CL; `--no-negatives` writes pairs only, as the experiment runner does to halve
the cost of a step) and prints each dataset's size:

- retrieval (query -> document): SciFact train claims -> cited abstracts (the qrels' train split;
  evaluation uses the disjoint test claims), SNLI premise -> entailment with the contradiction as
  negative, TrecQA question -> answer sentence; other datasets' negatives are random documents.
- classification: Banking77, Emotion and AmazonCounterfactual (en) train texts, each paired with
  another train text of the same label and one of a different label (their test splits are what
  the suite scores).
- clustering: TREC train questions paired by fine label, and the paraphrase pairs of
  `training_pairs/positive_pairs.jsonl` (MRPC, SICK, STS; leakage-filtered by the data's README).

Sizes are capped per dataset (`CAPS`, 4,100 rows in all) so that one epoch takes minutes on a CPU.
"""

from __future__ import annotations

import random
from pathlib import Path

from experiments.common import shared_data
from moe_embed import readers as R
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse
from moe_embed.training.data_tools import write_rows

CAPS = {
    "scifact": 600,
    "snli": 600,
    "trecqa": 200,
    "banking77": 500,
    "emotion": 500,
    "amazon_counterfactual": 500,
    "trec": 600,
    "paraphrases": 600,
}
TASK_OF = {
    "scifact": "retrieval",
    "snli": "retrieval",
    "trecqa": "retrieval",
    "banking77": "classification",
    "emotion": "classification",
    "amazon_counterfactual": "classification",
    "trec": "clustering",
    "paraphrases": "clustering",
}


def same_label_rows(texts: list[str], labels: list[str], cap: int, rng: random.Random) -> list[dict]:
    """(text, another text of its label, a text of another label) for up to `cap` texts."""
    by_label: dict[str, list[int]] = {}
    for index, label in enumerate(labels):
        by_label.setdefault(label, []).append(index)
    candidates = [i for i in range(len(texts)) if len(by_label[labels[i]]) > 1]
    rows = []
    for index in rng.sample(candidates, min(cap, len(candidates))):
        positive = rng.choice([j for j in by_label[labels[index]] if j != index])
        negative = rng.randrange(len(texts))
        while labels[negative] == labels[index]:
            negative = rng.randrange(len(texts))
        rows.append({"anchor": texts[index], "positive": texts[positive], "negative": texts[negative]})
    return rows


def with_random_negatives(pairs: list[tuple[str, str]], pool: list[str], cap: int, rng: random.Random) -> list[dict]:
    """(anchor, positive, a random text of `pool` other than the positive) for up to `cap` pairs."""
    rows = []
    for anchor, positive in rng.sample(pairs, min(cap, len(pairs))):
        negative = rng.choice(pool)
        while negative == positive:
            negative = rng.choice(pool)
        rows.append({"anchor": anchor, "positive": positive, "negative": negative})
    return rows


def build(root: Path, seed: int = 0) -> dict[str, list[dict]]:
    """Rows per dataset name (see the module docstring), read from the shared data folder `root`."""
    rng = random.Random(seed)
    datasets = {}
    scifact = R.beir(root / "retrieval/scifact", split="train")
    queries = {q["_id"]: q["text"] for q in R.read_jsonl(root / "retrieval/scifact/queries.jsonl")}
    pairs = [(queries[q], scifact.corpus[d]) for q, docs in sorted(scifact.relevant.items()) for d in sorted(docs)]
    datasets["scifact"] = with_random_negatives(pairs, sorted(scifact.corpus.values()), CAPS["scifact"], rng)
    snli = R.read_jsonl(root / "training_pairs/snli_devtest_triplets.jsonl")
    snli = rng.sample(snli, min(CAPS["snli"], len(snli)))
    datasets["snli"] = [{k: r[k] for k in ("anchor", "positive", "negative")} for r in snli]
    positives = R.read_jsonl(root / "training_pairs/positive_pairs.jsonl")
    trecqa = [(r["anchor"], r["positive"]) for r in positives if r["source"].startswith("trecqa")]
    datasets["trecqa"] = with_random_negatives(trecqa, [p for _, p in trecqa], CAPS["trecqa"], rng)
    for name, train, label in [
        ("banking77", "train.tsv", "label"),
        ("emotion", "train.tsv", "label"),
        ("amazon_counterfactual", "en_train.tsv", "label"),
        ("trec", "train.tsv", "fine_label"),
    ]:
        texts = R.labelled_texts(
            root / "classification" / name, None, train, label=label
        )  # the train split, read as "test"
        datasets[name] = same_label_rows(texts.test_texts, texts.test_labels, CAPS[name], rng)
    paraphrases = [(r["anchor"], r["positive"]) for r in positives if not r["source"].startswith(("trecqa", "snli"))]
    datasets["paraphrases"] = with_random_negatives(paraphrases, [p for _, p in paraphrases], CAPS["paraphrases"], rng)
    return datasets


def write(datasets: dict[str, list[dict]], output: Path, negatives: bool = True) -> dict[str, list[dict]]:
    """Write `<name>.jsonl` files into `output` (without the `negative` column unless `negatives`);
    returns the config's `tasks:` section."""
    output.mkdir(parents=True, exist_ok=True)
    tasks: dict[str, list[dict]] = {}
    for name, rows in datasets.items():
        if not negatives:
            rows = [{"anchor": row["anchor"], "positive": row["positive"]} for row in rows]
        path = output / f"{name}.jsonl"
        write_rows(path, rows, overwrite=True)
        tasks.setdefault(TASK_OF[name], []).append({"name": name, "path": str(path.resolve())})
    return tasks


def main(argv: list[str] | None = None, prog: str | None = None) -> dict:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="folder for the JSONL files")
    parser.add_argument(
        "--shared",
        help="the shared data folder (default: $MOE_EMBED_SHARED, else ../shared/data beside the repository)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling (default 0)")
    parser.add_argument("--no-negatives", action="store_true", help="write (anchor, positive) pairs only")
    args = parse(parser, argv)
    datasets = build(shared_data(args.shared), args.seed)
    tasks = write(datasets, Path(args.output), negatives=not args.no_negatives)
    for name, rows in datasets.items():
        print(f"{TASK_OF[name]:>14}  {name:<22} {len(rows):>5} rows")
    return tasks


if __name__ == "__main__":
    run_cli(main)
