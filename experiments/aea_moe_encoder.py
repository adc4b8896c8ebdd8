"""AEA on this project's token-routed MoE encoder.

    python -m experiments.aea_moe_encoder --output models/aea-experiment --seeds 0,1,2

No trained MoE language model can be downloaded here, so AEA (adaptive expert allocation, training
free) is judged on a MoE encoder trained here. Per seed, the bundled all-MiniLM-L6-v2 is upcycled to
the token-routed MoE (`convert/upcycle.py --arch moe`: every layer, 8 experts, top-2, renormalised
top-k weights, expert noise 0.02 so that the experts differ; the seed draws the noise and the router)
and trained with TA-CL and the load-balancing loss on the MoTE experiment's data and steps
(`experiments.prepare_data`, one epoch). On the trained model it then compares, with the encoder's
own prompt (the `classification: ` prefix) and mean pooling:

- `plain`: the unmodified model (`--allocation none`);
- `token`, `layer`, `aea`: token-wise, layer-wise and both allocations (floor rounding, the paper's);
- `aea-lr`: both, with budget-exact largest-remainder rounding of the token budgets;
- `moee-concat`, `moee-sum`: MoEE on the unmodified model (routing weights with the hidden state);
- `moee-sum+aea`: MoEE-sum of the AEA model.

Each variant gets its own α (0..10) and exit layer (3..6) by Spearman correlation on the STS-B dev
pairs, as `moe-embed calibrate-aea --search` chooses them, and is then scored on STS-B test and
SICK-R (the pairs `moe-embed evaluate` scores: cosine Spearman x 100). The search is run in process with the
converter's functions (one forward per distinct allocation serves the three embeddings); on seed 0
the `aea` variant is also written by the converter and scored through `moe-embed evaluate` to check the
saved folder against the in-process number. The homogeneity per layer is reported before and after
training. Training reads `../shared/data`; the STS pairs come from its Hub-layout copies in
`OUTPUT/hubdata` (`experiments.common.hub_data`). Finished steps are skipped; results go to
`OUTPUT/aea/*.json` and `OUTPUT/report.md`.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path

import yaml

from experiments import prepare_data
from experiments.common import TRAINING, evaluate, hub_data, moe_embed, run, shared_data, summary
from moe_embed.errors import UsageError, run_cli
from moe_embed.folders import bundled_minilm_path
from moe_embed.options import command_parser, parse

logger = logging.getLogger("experiment")
UPCYCLE = ["--arch", "moe", "--moe-layers", "all", "--num-local-experts", "8", "--num-experts-per-tok", "2"]
UPCYCLE += ["--norm-topk-prob", "--expert-noise", "0.02"]
# variant: (allocation, rounding, embedding)
VARIANTS = {
    "plain": ("none", "floor", "hidden"),
    "token": ("token", "floor", "hidden"),
    "layer": ("layer", "floor", "hidden"),
    "aea": ("both", "floor", "hidden"),
    "aea-lr": ("both", "largest-remainder", "hidden"),
    "moee-concat": ("none", "floor", "moee-concat"),
    "moee-sum": ("none", "floor", "moee-sum"),
    "moee-sum+aea": ("both", "floor", "moee-sum"),
}
ALPHAS = [float(a) for a in range(11)]
TEST_TASKS = ("STSBenchmark", "SICK-R")


def train(out: Path, seed: int, tasks: dict) -> tuple[Path, Path]:
    """Upcycle and train one seed; returns (upcycled folder, trained folder)."""
    base = out / "runs" / f"moe-base-s{seed}"
    if not (base / "config.json").exists():
        command = moe_embed("upcycle", *UPCYCLE, "--seed", str(seed), "--base", bundled_minilm_path())
        run([*command, "--output", str(base)], out / "logs" / f"upcycle-s{seed}.log")
    folder = out / "runs" / f"moe-s{seed}"
    if not (folder / "config_sentence_transformers.json").exists():
        config = {
            **TRAINING,
            "seed": seed,
            "output_dir": str(folder),
            "tasks": tasks,
            "model": str(base),
            "trust_remote_code": True,
        }
        path = out / "configs" / f"{folder.name}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        run(moe_embed("train", "--config", str(path)), out / "logs" / f"{folder.name}.log")
    return base, folder


def pairs_of(task: str, folder: Path | None) -> tuple[list[str], list[str], list[float]]:
    """The test pairs of the STS task `task` (`TEST_TASKS`) as `(sentences1, sentences2, scores)`: its Hub
    dataset's test split, from the data folder `folder`'s copy (None: the Hub)."""
    from moe_embed.data import load
    from moe_embed.evaluation.tasks import get_task, repo_of

    rows = load(repo_of(get_task(task)), None, "test", folder=folder, purpose=task)
    return list(rows["sentence1"]), list(rows["sentence2"]), [float(score) for score in rows["score"]]


def evaluate_seed(out: Path, seed: int, base: Path, folder: Path) -> dict:
    """Homogeneity before and after training, and every variant's search and test scores (cached in
    `OUTPUT/aea/sSEED.json`)."""
    from moe_embed.convert import aea_calibration as C
    from moe_embed.modeling.aea_homogeneity import measure_homogeneity
    from moe_embed.modeling.aea_layers import find_moe_layers
    from moe_embed.modeling.aea_pooling import EMBEDDINGS

    path = out / "aea" / f"s{seed}.json"
    if path.exists():
        return json.loads(path.read_text())
    data = hub_data(out)
    sets = {"dev": C.sts_dev(str(data)), **{task: pairs_of(task, data) for task in TEST_TASKS}}
    texts = {name: list(dict.fromkeys(pairs[0] + pairs[1])) for name, pairs in sets.items()}
    index = {name: {text: i for i, text in enumerate(unique)} for name, unique in texts.items()}
    template = C.default_template(folder, causal=False)
    homogeneity = {}
    for stage, source in (("upcycled", base), ("trained", folder)):
        model, tokenizer = C.load_model(source)
        batches = C.batches(tokenizer, texts["dev"], template, 64, 256)
        homogeneity[stage] = measure_homogeneity(model, batches)
    _, layers = find_moe_layers(model)
    exits = list(range(len(layers) - 3, len(layers) + 1))  # calibrate_aea --search's default: the last four
    cache = {}

    def score(name: str, layer_top_k, token_wise: bool, rounding: str, exit_layer: int, kind: str) -> float:
        key = (name, tuple(layer_top_k), token_wise, rounding if token_wise else "-", exit_layer)
        if key not in cache:
            settings = {"layer_top_k": layer_top_k, "token_wise": token_wise, "rounding": rounding}
            controller = C.controller_for(model, {**settings, "exit_layer": exit_layer})
            cache[key] = C.embed_kinds(controller, tokenizer, texts[name], template, "mean", EMBEDDINGS)
            logger.info("seed %d: %s, %s", seed, name, key[1:])
        return C.pair_spearman(cache[key][kind], index[name], sets[name])

    result = {"homogeneity": homogeneity, "variants": {}}
    for variant, (allocation, rounding, kind) in VARIANTS.items():
        token_wise = allocation in ("both", "token")
        alphas = ALPHAS if allocation in ("both", "layer") else [1.0]
        scores, allocations = {}, {}
        for alpha in alphas:
            for m in exits:
                top_k, _ = C.layer_allocation(allocation, homogeneity["trained"], layers, alpha, 1.0, m)
                allocations[(alpha, m)] = top_k
                scores[(alpha, m)] = score("dev", top_k, token_wise, rounding, m, kind)
        alpha, m = C.pick(scores)
        row = {"alpha": alpha if allocation in ("both", "layer") else None, "exit_layer": m}
        row.update(layer_top_k=allocations[(alpha, m)], dev=scores[(alpha, m)])
        for task in TEST_TASKS:
            row[task] = score(task, allocations[(alpha, m)], token_wise, rounding, m, kind)
        result["variants"][variant] = row
        logger.info("seed %d: %s %s", seed, variant, row)
    last = len(layers)  # the model as trained and saved: no allocation, every layer
    top_k, _ = C.layer_allocation("none", homogeneity["trained"], layers, 1.0, 1.0, last)
    row = {"alpha": None, "exit_layer": last, "layer_top_k": top_k}
    row.update({name: score(name, top_k, False, "-", last, "hidden") for name in ("dev", *TEST_TASKS)})
    result["variants"]["model"] = row
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    return result


def saved(out: Path, seed: int, checked: bool) -> bool:
    """Whether a seed's results (and, for the first seed, the folder check) are already saved."""
    result = (out / "aea" / f"s{seed}.json").exists()
    return result and (not checked or (out / "results" / f"folder-aea-s{seed}.json").exists())


def check_folder(out: Path, folder: Path, seed: int) -> dict:
    """The `aea` variant written by `moe-embed calibrate-aea --search` and scored by `moe-embed evaluate`
    through Sentence-Transformers, as a user would run it."""
    target = out / "folders" / f"aea-s{seed}"
    if not (target / "aea_config.json").exists():
        command = moe_embed("calibrate-aea", str(folder), "--output", str(target), "--search", "--overwrite")
        command += ["--data-dir", str(hub_data(out))]  # the STS-B dev pairs it searches on
        run(command, out / "logs" / f"calibrate-aea-s{seed}.log")
    return evaluate(out, f"folder-aea-s{seed}", str(target), ",".join(TEST_TASKS))


def spread(values: list[float]) -> str:
    """`mean ± sample sd` with three decimals (homogeneities lie in [-1, 1])."""
    mean = statistics.mean(values)
    return f"{mean:.3f}" if len(values) == 1 else f"{mean:.3f} ± {statistics.stdev(values):.3f}"


def write_report(out: Path, seeds: list[int]) -> str:
    """Markdown over `OUTPUT/aea/s*.json` (mean ± sample sd over seeds) to `OUTPUT/report.md`."""
    results = {seed: json.loads(p.read_text()) for seed in seeds if (p := out / "aea" / f"s{seed}.json").exists()}
    if not results:
        raise UsageError(f"no results in {out / 'aea'}; run without --report-only first")
    done = list(results)

    def values(variant: str, column: str) -> list[float]:
        rows = [results[seed]["variants"][variant] for seed in done]
        if column == "test":
            return [statistics.mean(row[t] for t in TEST_TASKS) for row in rows]
        return [row[column] for row in rows]

    lines = [f"Seeds {', '.join(map(str, done))}; Spearman x 100 of cosine similarities, mean ± sd over seeds.", ""]
    lines += ["| variant | STS-B dev | STS-B test | SICK-R | test mean | Δ test mean vs plain | α | exit layer |"]
    lines += ["|---|---:|---:|---:|---:|---:|---|---|"]
    plain = values("plain", "test")
    for variant in ["model", *VARIANTS]:
        delta = [a - b for a, b in zip(values(variant, "test"), plain, strict=True)]
        alphas = "/".join(f"{a:g}" for a in values(variant, "alpha") if a is not None)
        cells = [summary(values(variant, column)) for column in ("dev", *TEST_TASKS, "test")]
        cells += [summary(delta, signed=True) if variant != "plain" else "", alphas]
        lines.append(f"| {variant} | {' | '.join(cells)} | {'/'.join(map(str, values(variant, 'exit_layer')))} |")
    lines += ["", "Expert homogeneity (mean pairwise cosine of the experts' outputs), mean ± sd over seeds:", ""]
    lines += ["| layer | upcycled | trained |", "|---:|---:|---:|"]
    for layer in range(len(results[done[0]]["homogeneity"]["trained"])):
        stages = ("upcycled", "trained")
        cells = [spread([results[seed]["homogeneity"][stage][layer] for seed in done]) for stage in stages]
        lines.append(f"| {layer} | {' | '.join(cells)} |")
    lines += ["", "Layer allocation (k per layer, 0 after the exit) chosen on STS-B dev:", ""]
    for variant in ("layer", "aea", "aea-lr", "moee-sum+aea"):
        chosen = ", ".join(f"s{seed}: {results[seed]['variants'][variant]['layer_top_k']}" for seed in done)
        lines.append(f"- {variant}: {chosen}")
    check = out / "results" / f"folder-aea-s{done[0]}.json"
    if check.exists():
        saved = json.loads(check.read_text())
        in_process = results[done[0]]["variants"]["aea"]
        lines += ["", f"Seed {done[0]}'s `aea` by `moe-embed calibrate-aea --search`, scored by `moe-embed evaluate`:"]
        lines += [", ".join(f"{t} {saved[t]['main_score']:.2f} (in process {in_process[t]:.2f})" for t in TEST_TASKS)]
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text)
    return text


def main(argv: list[str] | None = None, prog: str | None = None) -> str:
    parser = command_parser(__doc__, prog)
    parser.add_argument("--output", required=True, help="folder for data, models, logs, results and report.md")
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated training seeds (default 0,1,2)")
    parser.add_argument("--train-only", action="store_true", help="upcycle and train, then stop")
    parser.add_argument("--report-only", action="store_true", help="write report.md from OUTPUT/aea only")
    args = parse(parser, argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        parser.error(f"--seeds expects comma-separated integers, got {args.seeds!r}")
    out = Path(args.output).resolve()
    if not args.report_only:
        tasks = prepare_data.write(prepare_data.build(shared_data()), out / "data", negatives=False)
        for seed in seeds:  # seed by seed, so that a partial run already reports
            if saved(out, seed, checked=seed == seeds[0]) and not args.train_only:
                continue  # results saved (e.g. copied from experiments/results/aea): no need for the models
            base, folder = train(out, seed, tasks)
            if args.train_only:
                continue
            evaluate_seed(out, seed, base, folder)
            if seed == seeds[0]:
                check_folder(out, folder, seed)
        if args.train_only:
            return ""
    text = write_report(out, seeds)
    print(text)
    return text


if __name__ == "__main__":
    run_cli(main)
