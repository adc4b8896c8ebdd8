"""Inter-task similarity of task-specialised embeddings (MoTE paper section 5.4, Figure 3).

    python -m moe_embed.evaluation.intertask models/ic models/mote --names IC,MoTE --output-dir results/intertask

Each text is embedded once per task (with the model's prompt for it: `query`, `document`,
`classification`, `clustering`), and for every pair of tasks the cosine similarity of a text's two
embeddings is one sample. Lower similarity means more specialised embeddings. For each pair a
one-sided Welch t-test (`scipy.stats.ttest_ind(equal_var=False, alternative="less")`) tests
H1: mean similarity of the first model < that of the second. Texts default to 128 documents of the
SciFact corpus drawn with `--seed` (the paper used 128 Wikipedia articles, which the suite's data
lacks); `--texts FILE` takes one text per line instead. Writes `intertask.json` and
`intertask.png` (a box plot per task pair and model) to `--output-dir` and prints a markdown table.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from moe_embed import data as D
from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import UsageError, run_cli
from moe_embed.folders import load_sentence_transformer
from moe_embed.modeling.defaults import prompt_key
from moe_embed.options import option, parse_options
from moe_embed.readers import corpus_texts

TASKS = ("query", "document", "classification", "clustering")
LABELS = {
    "query": "search query",
    "document": "search document",
    "classification": "classification",
    "clustering": "clustering",
}


def task_embeddings(model, texts: list[str], batch_size: int = 32) -> dict[str, np.ndarray]:
    """Unit-normalised embeddings of `texts` under each task's prompt; a UsageError if a prompt is missing."""
    missing = [task for task in TASKS if prompt_key(task) not in (model.prompts or {})]
    if missing:
        raise UsageError(f"the model defines no prompt for {missing}; expected prompts named {', '.join(TASKS)}")
    return {
        task: model.encode(
            texts,
            prompt_name=prompt_key(task),
            batch_size=batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        for task in TASKS
    }


def pair_similarities(embeddings: dict[str, np.ndarray]) -> dict[tuple[str, str], np.ndarray]:
    """Per task pair, the cosine similarity of each text's two embeddings."""
    return {(a, b): np.sum(embeddings[a] * embeddings[b], axis=1) for a, b in combinations(TASKS, 2)}


def welch_less(first: np.ndarray, second: np.ndarray) -> tuple[float, float]:
    """(t, p) of the one-sided Welch t-test with H1: mean(first) < mean(second)."""
    from scipy.stats import ttest_ind

    result = ttest_ind(first, second, equal_var=False, alternative="less")
    return float(result.statistic), float(result.pvalue)


def compare(similarities: list[dict], names: list[str]) -> list[dict]:
    """Rows per task pair: mean and sd of each model's similarities, Welch t and p (first < second)."""
    rows = []
    for pair in similarities[0]:
        first, second = similarities[0][pair], similarities[1][pair]
        t, p = welch_less(first, second)
        rows.append(
            {
                "tasks": list(pair),
                **{f"{name}_mean": float(s[pair].mean()) for name, s in zip(names, similarities, strict=True)},
                **{f"{name}_sd": float(s[pair].std(ddof=1)) for name, s in zip(names, similarities, strict=True)},
                "t": t,
                "p": p,
            }
        )
    return rows


def plot(similarities: list[dict], names: list[str], path: Path) -> None:
    """Box plots of the similarities, one group per task pair, one box per model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(similarities[0])
    figure, axis = plt.subplots(figsize=(1.9 * len(pairs) + 1, 4.2))
    width = 0.8 / len(names)
    for index, (name, values) in enumerate(zip(names, similarities, strict=True)):
        positions = [p + (index - (len(names) - 1) / 2) * width for p in range(len(pairs))]
        boxes = axis.boxplot(
            [values[pair] for pair in pairs],
            positions=positions,
            widths=width * 0.9,
            patch_artist=True,
            showfliers=False,
            medianprops={"color": "black"},
        )
        for box in boxes["boxes"]:
            box.set_facecolor(f"C{index}")
        axis.plot([], [], color=f"C{index}", linewidth=8, label=name)
    axis.set_xticks(range(len(pairs)))
    axis.set_xticklabels([f"{LABELS[a]}\nvs {LABELS[b]}" for a, b in pairs], fontsize=8)
    axis.set_ylabel("cosine similarity of one text's two embeddings")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def format_p(p: float) -> str:
    """A p-value for the table; one below float precision shows as `< 1e-300`."""
    return f"{p:.2g}" if p > 0 else "< 1e-300"


def default_texts(data_dir: str | None, count: int, seed: int) -> list[str]:
    """`count` SciFact documents (mteb/scifact's corpus), drawn with `seed`."""
    corpus = D.load("mteb/scifact", "corpus", "corpus", folder=D.data_dir(data_dir), purpose="the default texts")
    documents = corpus_texts(corpus)
    return random.Random(seed).sample(documents, min(count, len(documents)))


@dataclass
class IntertaskOptions:
    """`moe-embed intertask`'s options (its `--help` is generated from the fields)."""

    models: list[str] = option(
        required=True,
        positional=True,
        nargs=2,
        help="two model folders or Hub ids; the test asks whether the first is lower",
    )
    output_dir: str = option(required=True, help="folder for intertask.json and intertask.png")
    names: str | None = option(help="comma-separated display names of the two models")
    texts: str | None = option(help="file with one text per line (default: SciFact documents)")
    count: int = option(128, help="number of default texts (default 128)")
    seed: int = option(0, help="seed of the default texts' draw (default 0)")
    data_dir: str | None = option(help=DATA_DIR_HELP)
    trust_remote_code: bool = option(False, help="allow the models' own code (MoTE)")


def main(argv: list[str] | None = None, prog: str | None = None) -> list[dict]:
    args = parse_options(IntertaskOptions, argv, __doc__, prog)
    names = args.names.split(",") if args.names else [Path(m).name or m for m in args.models]
    if len(names) != 2 or len(set(names)) != 2:
        raise UsageError(f"--names takes two different comma-separated names, got {args.names!r}")
    if args.texts:
        try:
            texts = [line.strip() for line in Path(args.texts).read_text(encoding="utf-8").splitlines() if line.strip()]
        except FileNotFoundError:
            raise UsageError(f"texts file {args.texts} not found") from None
    else:
        texts = default_texts(args.data_dir, args.count, args.seed)
    if len(texts) < 3:
        raise UsageError(f"need at least 3 texts for the t-tests, got {len(texts)}")
    models = [load_sentence_transformer(m, trust_remote_code=args.trust_remote_code) for m in args.models]
    similarities = [pair_similarities(task_embeddings(model, texts)) for model in models]
    rows = compare(similarities, names)
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "intertask.json").write_text(
        json.dumps({"models": dict(zip(names, args.models, strict=True)), "texts": len(texts), "pairs": rows}, indent=2)
        + "\n"
    )
    plot(similarities, names, out / "intertask.png")
    a, b = names
    print(f"| tasks | {a} | {b} | Welch t | p ({a} < {b}) |\n|---|---:|---:|---:|---:|")
    for row in rows:
        print(
            f"| {LABELS[row['tasks'][0]]} vs {LABELS[row['tasks'][1]]} | {row[f'{a}_mean']:.3f} ± {row[f'{a}_sd']:.3f} "
            f"| {row[f'{b}_mean']:.3f} ± {row[f'{b}_sd']:.3f} | {row['t']:.2f} | {format_p(row['p'])} |"
        )
    return rows


if __name__ == "__main__":
    run_cli(main)
