"""Write the development data of `../shared/data` as a data folder: local copies of the Hub datasets the
evaluation suite names, in the layout `moe-embed data download` gives (`DIR/<owner>/<name>/` with a card
whose `configs:` section names JSON-lines files), so that every command reads it with `--data-dir DIR`; beside
them `DIR/training_pairs/`, the pair files `examples/train_mote.yaml` reads as `{data}/training_pairs/...`.

    python -m experiments.shared_to_hub --output data/hub [--shared ../shared/data] [--overwrite]

For a machine without the Hub: the copies hold the same rows as the Hub repositories, in the columns mteb
reads, except where `DIFFERENCES` says (docs/data.md repeats it). Nothing is written where a copy exists,
unless `--overwrite`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from moe_embed.errors import UsageError, run_cli
from moe_embed.files import atomic_output_dir
from moe_embed.options import command_parser, parse
from moe_embed.readers import read_jsonl, read_tsv

SHARED_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data"

# where a copy written here is not the Hub repository row for row
DIFFERENCES = {
    "mteb/twitterurlcorpus-pairclassification": "test holds Lan et al.'s 9,334 labelled test pairs; the Hub's "
    "test split also holds the 42,200 train pairs (51,534 in all)",
    "mteb/scifact": "rebuilt from a CSV export of allenai/scifact (41 characters of whitespace differ in the "
    "corpus); same ids and judgements",
    "stanfordnlp/sst2": "train and validation only (the Hub's test split has no labels); SentEval's copy",
    "CogComp/trec": "labels are the class names (ABBR, NUM:date, ...), where the Hub has their indices",
}


def _write(folder: Path, configs: dict[str, dict[str, list[dict]]]) -> None:
    """Write `configs` (config name -> split -> rows) as JSON-lines files and a card naming them."""
    card = ["---", "configs:"]
    for config, splits in configs.items():
        card += [f"- config_name: {config}", "  data_files:"]
        for split, rows in splits.items():
            relative = f"{split}.jsonl" if config == "default" else f"{config}/{split}.jsonl"
            path = folder / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows), encoding="utf-8")
            card += [f"  - split: {split}", f"    path: {relative}"]
    card += ["---", "", "A local copy written by `python -m experiments.shared_to_hub` from ../shared/data.", ""]
    (folder / "README.md").write_text("\n".join(card), encoding="utf-8")


def _sts(rows: list[dict]) -> list[dict]:
    return [{"sentence1": r["sentence1"], "sentence2": r["sentence2"], "score": float(r["score"])} for r in rows]


def _texts(rows: list[dict], label: str = "label") -> list[dict]:
    return [{"text": r["text"], "label": r[label]} for r in rows]


def copies(shared: Path) -> dict[str, dict[str, dict[str, list[dict]]]]:
    """Hub id -> config -> split -> rows, read from the `../shared/data` layout."""
    sts, cls = shared / "sts", shared / "classification"
    scifact = shared / "retrieval" / "scifact"
    return {
        "mteb/stsbenchmark-sts": {
            "default": {
                s: _sts(read_tsv(sts / f"stsb/{f}.tsv"))
                for s, f in [("train", "train"), ("validation", "dev"), ("test", "test")]
            }
        },
        "mteb/sickr-sts": {
            "default": {
                "test": _sts([r for f in ("train", "trial", "test") for r in read_tsv(sts / f"sick-r/{f}.tsv")])
            }
        },
        "mteb/scifact": {
            "default": {
                split: [
                    {"query-id": r["query-id"], "corpus-id": r["corpus-id"], "score": int(r["score"])}
                    for r in read_tsv(scifact / f"qrels/{split}.tsv")
                ]
                for split in ("train", "test")
            },
            "corpus": {
                "corpus": [
                    {"_id": d["_id"], "title": d.get("title", ""), "text": d["text"]}
                    for d in read_jsonl(scifact / "corpus.jsonl")
                ]
            },
            "queries": {
                "queries": [{"_id": q["_id"], "text": q["text"]} for q in read_jsonl(scifact / "queries.jsonl")]
            },
        },
        "mteb/twitterurlcorpus-pairclassification": {
            "default": {
                "test": [
                    {"sent1": r["sentence1"], "sent2": r["sentence2"], "labels": int(r["label"])}
                    for r in read_tsv(shared / "pair_classification/twitter_url_corpus/test.tsv")
                    if r["label"] != ""  # n = 3 of 6 votes: unlabelled, as in the Hub copy
                ]
            }
        },
        "mteb/banking77": {"default": {s: _texts(read_tsv(cls / f"banking77/{s}.tsv")) for s in ("train", "test")}},
        "mteb/emotion": {
            "default": {
                s: _texts(read_tsv(cls / f"emotion/{s}.tsv"), "label_id") for s in ("train", "validation", "test")
            }
        },
        "mteb/amazon_counterfactual": {
            "en": {
                s: [
                    {"text": r["text"], "label": int(r["label"])}
                    for r in read_tsv(cls / f"amazon_counterfactual/en_{f}.tsv")
                ]
                for s, f in [("train", "train"), ("validation", "valid"), ("test", "test")]
            }
        },
        "stanfordnlp/sst2": {
            "default": {
                s: [
                    {"idx": i, "sentence": r["text"], "label": int(r["label"])}
                    for i, r in enumerate(read_tsv(cls / f"sst2/{f}.tsv"))
                ]
                for s, f in [("train", "train"), ("validation", "dev")]
            }
        },
        "CogComp/trec": {
            "default": {
                s: [
                    {"text": r["text"], "coarse_label": r["coarse_label"], "fine_label": r["fine_label"]}
                    for r in read_tsv(cls / f"trec/{s}.tsv")
                ]
                for s in ("train", "test")
            }
        },
    }


def write_copies(shared: Path, output: Path, overwrite: bool = False) -> list[str]:
    """Write every copy of `copies(shared)` under `output`; returns the Hub ids written."""
    if not (shared / "sts").is_dir():
        raise UsageError(f"{shared} is not the shared data folder (expected sts/, classification/, retrieval/ in it)")
    written = []
    for repo, configs in copies(shared).items():
        if (output / repo).exists() and not overwrite:
            continue
        with atomic_output_dir(output / repo, overwrite=True) as tmp:
            _write(tmp, configs)
        written.append(repo)
    pairs = output / "training_pairs"  # the local recipe's pair files ({data}/training_pairs/...), as they are
    if (shared / "training_pairs").is_dir() and (overwrite or not pairs.exists()):
        with atomic_output_dir(pairs, overwrite=True) as tmp:
            for path in sorted((shared / "training_pairs").glob("*.jsonl")):
                shutil.copyfile(path, tmp / path.name)
        written.append("training_pairs")
    return written


def main(argv: list[str] | None = None, prog: str | None = None) -> list[str]:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="the data folder to write (pass it later as --data-dir)")
    parser.add_argument("--shared", default=str(SHARED_DATA), help="the shared data folder (default: ../shared/data)")
    parser.add_argument("--overwrite", action="store_true", help="write again copies that are already there")
    args = parse(parser, argv)
    written = write_copies(Path(args.shared), Path(args.output), args.overwrite)
    print(f"wrote {len(written)} dataset copies to {args.output}: {', '.join(written) or 'none (all there)'}")
    return written


if __name__ == "__main__":
    run_cli(main)
