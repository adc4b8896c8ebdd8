"""Why the suite's clustering scores moved when mteb took over: the former suite averaged mini-batch k-means over
10 seeds (42-51); mteb's single-set protocol (`AbsTaskClusteringLegacy`) runs it once, seed 42. This prints, per
clustering task, mteb's score and the two protocols computed on the same embeddings (docs/results.md).

    python -m experiments.clustering_protocols [MODEL] --data-dir data/shared-hub
"""

from __future__ import annotations

from moe_embed.data import DATA_DIR_HELP
from moe_embed.errors import run_cli
from moe_embed.options import command_parser, parse

TASKS = ("Banking77Clustering", "TRECClustering")


def v_measures(embeddings, labels, seeds: range) -> list[float]:
    """V-measure of mini-batch k-means (k = number of labels; mteb's settings) for each seed."""
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.metrics import v_measure_score

    k = len(set(labels))
    return [
        v_measure_score(
            labels, MiniBatchKMeans(k, batch_size=500, n_init="auto", random_state=s).fit_predict(embeddings)
        )
        for s in seeds
    ]


def main(argv: list[str] | None = None, prog: str | None = None) -> list[dict]:
    import numpy as np

    from moe_embed.evaluation.run import load_tasks, select_tasks
    from moe_embed.evaluation.tasks import SUITE, score
    from moe_embed.folders import bundled_minilm_path, load_sentence_transformer

    parser = command_parser(__doc__, prog)
    parser.add_argument("model", nargs="?", help="model folder or Hub id (default: the bundled all-MiniLM-L6-v2)")
    parser.add_argument("--tasks", default=",".join(TASKS), help="comma-separated clustering tasks of the suite")
    parser.add_argument("--data-dir", help=DATA_DIR_HELP)
    args = parse(parser, argv)
    tasks = load_tasks([name for name in select_tasks(args.tasks) if SUITE[name] == "Clustering"], args.data_dir)
    model = load_sentence_transformer(args.model or bundled_minilm_path(), trust_remote_code=True)
    rows = []
    print("| task | mteb | one run, seed 42 | mean of seeds 42-51 |\n|---|---:|---:|---:|")
    for name, task in tasks.items():
        data = task.dataset["test"][0]
        embeddings = model.encode(list(data["sentences"]), prompt=(model.prompts or {}).get("Clustering", ""))
        runs = v_measures(np.asarray(embeddings), list(data["labels"]), range(42, 52))
        row = {"task": name, "mteb": score(model, task), "seed42": 100 * runs[0], "mean10": 100 * float(np.mean(runs))}
        rows.append(row)
        print(f"| {name} | {row['mteb']:.2f} | {row['seed42']:.2f} | {row['mean10']:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    run_cli(main)
