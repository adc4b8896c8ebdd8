"""experiments: the shared data folder they train on and the Hub-layout copies they evaluate on, the training
pairs built from the shared train splits, the STS pairs and dev signals read through mteb, and the seed report."""

import json
from pathlib import Path

import pytest
from conftest import FIXTURE_DATA, SHARED_DATA, requires_shared_data

from experiments import comoe_vs_lora, prepare_data
from experiments.common import report, summary


def _tsv(path, header, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\t".join(header) + "\n" + "".join("\t".join(map(str, r)) + "\n" for r in rows))


def _jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture()
def shared(tmp_path):
    """A tiny copy of ../shared/data's layout."""
    root = tmp_path / "data"
    scifact = root / "retrieval/scifact"
    _jsonl(scifact / "corpus.jsonl", [{"_id": f"d{i}", "title": f"T{i}", "text": f"doc {i}"} for i in range(6)])
    _jsonl(scifact / "queries.jsonl", [{"_id": f"q{i}", "text": f"claim {i}"} for i in range(4)])
    _tsv(
        scifact / "qrels/train.tsv",
        ["query-id", "corpus-id", "score"],
        [["q0", "d0", 1], ["q1", "d1", 1], ["q1", "d2", 1]],
    )
    _tsv(scifact / "qrels/test.tsv", ["query-id", "corpus-id", "score"], [["q3", "d3", 1]])
    _jsonl(
        root / "training_pairs/snli_devtest_triplets.jsonl",
        [
            {
                "anchor": f"premise {i}",
                "positive": f"entailed {i}",
                "negative": f"contradiction {i}",
                "source": "snli_dev",
            }
            for i in range(5)
        ],
    )
    _jsonl(
        root / "training_pairs/positive_pairs.jsonl",
        [{"anchor": f"question {i}", "positive": f"answer {i}", "source": "trecqa_train_qa"} for i in range(4)]
        + [{"anchor": f"para {i}", "positive": f"phrase {i}", "source": "mrpc_train_paraphrase"} for i in range(4)]
        + [{"anchor": "snli only", "positive": "x", "source": "snli_dev"}],
    )
    for name, train in [
        ("banking77", "train.tsv"),
        ("emotion", "train.tsv"),
        ("amazon_counterfactual", "en_train.tsv"),
    ]:
        _tsv(
            root / "classification" / name / train, ["text", "label"], [[f"{name} {i}", f"L{i % 3}"] for i in range(9)]
        )
    _tsv(
        root / "classification/trec/train.tsv",
        ["text", "coarse_label", "fine_label"],
        [[f"trec {i}", "C", f"F{i % 2}"] for i in range(6)],
    )
    return root


def test_build_pairs_follow_the_labels_and_splits(shared):
    datasets = prepare_data.build(shared, seed=0)
    assert set(datasets) == set(prepare_data.TASK_OF)
    labels = {
        f"{name} {i}": f"L{i % 3}" for name in ("banking77", "emotion", "amazon_counterfactual") for i in range(9)
    }
    labels.update({f"trec {i}": f"F{i % 2}" for i in range(6)})
    for name in ("banking77", "emotion", "amazon_counterfactual", "trec"):
        assert len(datasets[name]) == (9 if name != "trec" else 6)
        for row in datasets[name]:
            assert row["anchor"] != row["positive"] and labels[row["anchor"]] == labels[row["positive"]]
            assert labels[row["negative"]] != labels[row["anchor"]]
    # SciFact: the train qrels only (q3 is a test claim), title + text as the document
    assert sorted((r["anchor"], r["positive"]) for r in datasets["scifact"]) == [
        ("claim 0", "T0 doc 0"),
        ("claim 1", "T1 doc 1"),
        ("claim 1", "T2 doc 2"),
    ]
    assert all(r["negative"] != r["positive"] for name in ("scifact", "trecqa", "paraphrases") for r in datasets[name])
    assert {r["anchor"] for r in datasets["trecqa"]} == {f"question {i}" for i in range(4)}
    assert {r["anchor"] for r in datasets["paraphrases"]} == {f"para {i}" for i in range(4)}  # no TrecQA or SNLI rows
    assert [r["negative"] for r in datasets["snli"]] and all(
        r["negative"].startswith("contradiction") for r in datasets["snli"]
    )
    assert prepare_data.build(shared, seed=0) == datasets and prepare_data.build(shared, seed=1) != datasets


def test_write_pairs_only_and_the_tasks_section(shared, tmp_path):
    tasks = prepare_data.write(prepare_data.build(shared), tmp_path / "out", negatives=False)
    assert {t: [d["name"] for d in specs] for t, specs in tasks.items()} == {
        "retrieval": ["scifact", "snli", "trecqa"],
        "classification": ["banking77", "emotion", "amazon_counterfactual"],
        "clustering": ["trec", "paraphrases"],
    }
    rows = [json.loads(line) for line in (tmp_path / "out/snli.jsonl").read_text().splitlines()]
    assert rows and all(set(row) == {"anchor", "positive"} for row in rows)


def test_report_gives_mean_and_sample_sd_per_task_type():
    def run(sts, banking, emotion):
        return {
            "STSBenchmark": {"main_score": sts},
            "Banking77Classification": {"main_score": banking},
            "EmotionClassification": {"main_score": emotion},
        }

    names = ["STSBenchmark", "Banking77Classification", "EmotionClassification"]
    text = report(
        {
            "base": {None: run(80, 70, 40)},
            "mote": {0: run(82, 71, 41), 2: run(84, 73, 45)},
            "ic": {0: run(81, 70, 40), 1: run(90, 90, 90), 2: run(82, 72, 44)},
        },
        names,
    )
    lines = text.strip().splitlines()
    assert lines[0] == (  # grouped by mteb's task types
        "| model | STSBenchmark | Banking77Classification | EmotionClassification | STS (avg) | "
        "Classification (avg) | average | seeds |"
    )
    assert lines[2] == "| base | 80.00 | 70.00 | 40.00 | 80.00 | 55.00 | 63.33 | 1 |"
    # seeds' classification averages 56 and 59; overall averages 64.67 and 67.33
    assert lines[3] == (
        "| mote | 83.00 ± 1.41 | 72.00 ± 1.41 | 43.00 ± 2.83 | 83.00 ± 1.41 | 57.50 ± 2.12 | 66.00 ± 1.89 | 2 |"
    )
    # paired with IC on seeds 0 and 2 only (seed 1 has no MoTE run): +1/+2 STS, +1/+1 Banking, +1/+1 Emotion
    assert lines[-2].startswith("|---|") and not any(line.startswith("| base −") for line in lines)
    assert lines[-1] == (
        "| mote − ic | +1.50 ± 0.71 | +1.00 ± 0.00 | +1.00 ± 0.00 | +1.50 ± 0.71 | +1.00 ± 0.00 | +1.17 ± 0.24 | 2 |"
    )
    assert summary([]) == "—"


def test_report_only_reads_the_result_files_that_exist(tmp_path, capsys):
    from experiments.mote_vs_ic import main

    (tmp_path / "results").mkdir()
    for name, score in [("base", 80.0), ("mote-s0", 81.0), ("mote-s2", 83.0), ("ic-s1", 79.0)]:
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps({"STSBenchmark": {"main_score": score}}))
    text = main(["--output", str(tmp_path), "--report-only", "--tasks", "STSBenchmark", "--variants", "ic,mote,ea"])
    assert text == (tmp_path / "report.md").read_text()
    rows = text.strip().splitlines()[2:]
    assert rows == [
        "| base (no prompts) | 80.00 | 80.00 | 80.00 | 1 |",
        "| ic | 79.00 | 79.00 | 79.00 | 1 |",
        "| mote | 82.00 ± 1.41 | 82.00 ± 1.41 | 82.00 ± 1.41 | 2 |",
    ]  # no EA scores: no row


def test_report_reference_variant(tmp_path, capsys):
    from experiments.mote_vs_ic import main

    (tmp_path / "results").mkdir()
    for name, score in [
        ("ic-s0", 70.0),
        ("mote-s0", 72.0),
        ("mote-s1", 71.0),
        ("static-s0", 75.0),
        ("static-s1", 70.0),
    ]:
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps({"STSBenchmark": {"main_score": score}}))
    text = main(
        ["--output", str(tmp_path), "--report-only", "--tasks", "STSBenchmark", "--seeds", "0,1", "--reference", "mote"]
    )
    lines = text.strip().splitlines()
    assert "Difference to mote, same seed:" in lines
    # seed 0: 75 - 72 = +3, seed 1: 70 - 71 = -1 (IC has only seed 0: +70 - 72 = -2)
    assert lines[-2] == "| ic − mote | -2.00 | -2.00 | -2.00 | 1 |"
    assert lines[-1] == "| static − mote | +1.00 ± 2.83 | +1.00 ± 2.83 | +1.00 ± 2.83 | 2 |"
    with pytest.raises(SystemExit):
        main(["--output", str(tmp_path), "--report-only", "--variants", "ic,mote", "--reference", "static"])
    assert "--reference must be one of the variants (ic,mote)" in capsys.readouterr().err


def test_report_groups_tasks_by_domain():
    names = ["STSBenchmark", "TwitterURLCorpus", "SST2Classification"]
    groups = comoe_vs_lora.domain_groups(names)
    assert groups == {
        "in-domain": ["STSBenchmark"],
        "out-of-domain": ["TwitterURLCorpus", "SST2Classification"],
    }
    run = {name: {"main_score": score} for name, score in zip(names, (80.0, 70.0, 60.0), strict=True)}
    lines = report({"lora-r16": {0: run}}, names, "lora-r16", groups).strip().splitlines()
    assert lines[0].endswith("| in-domain (avg) | out-of-domain (avg) | average | seeds |")
    assert lines[2] == "| lora-r16 | 80.00 | 70.00 | 60.00 | 80.00 | 65.00 | 70.00 | 1 |"


def test_comoe_experiment_variants_and_rank_matched_parameters(tmp_path):
    """LoRA r = 66 has exactly CoMoE's trainable parameters (per linear 4·16·(384+384) + 4·384 = 66·768)."""
    from moe_embed.folders import bundled_minilm_path

    base = bundled_minilm_path()
    counts = {v: comoe_vs_lora.trainable_parameters(v, base) for v in ("lora-r16", "lora-r66", "comoe")}
    linears = 6 * 4
    assert counts == {"lora-r16": linears * 16 * 768, "lora-r66": linears * 66 * 768, "comoe": linears * 50688}
    assert comoe_vs_lora.variant_settings("comoe-l0.1") == {"arch": "comoe", "adapter": {"contrastive_loss_coef": 0.1}}
    assert comoe_vs_lora.variant_settings("moe-lora")["adapter"]["contrastive_loss_coef"] == 0.0
    with pytest.raises(ValueError, match="unknown variant 'gpt'"):
        comoe_vs_lora.variant_settings("gpt")
    with pytest.raises(SystemExit):
        comoe_vs_lora.main(["--output", str(tmp_path), "--variants", "lora-r16,dora"])


def test_usage_report_averages_over_tasks(tmp_path):
    def rows(cosines, top):
        return [
            {"layer": layer, "shares": [top, 1 - top, 0, 0], "cosine": cosine, "tokens": 10}
            for layer, cosine in enumerate(cosines)
        ]

    (tmp_path / "usage").mkdir()
    usage = {"STSBenchmark": rows([0.2, None], 0.5), "TRECClustering": rows([0.4, None], 0.7)}
    (tmp_path / "usage" / "comoe-s0.json").write_text(json.dumps(usage))
    lines = comoe_vs_lora.usage_report(tmp_path).strip().splitlines()
    assert "| comoe-s0 | 0.300 | — |" in lines
    assert "| comoe-s0 | 60.0 (50.0-70.0) | 60.0 (50.0-70.0) |" in lines
    assert comoe_vs_lora.usage_report(tmp_path / "nothing") == ""


def test_aea_report_means_deltas_and_missing_seeds(tmp_path):
    from experiments import aea_moe_encoder as A

    def seed_result(offset):
        variants = {}
        for i, name in enumerate(["model", *A.VARIANTS]):
            variants[name] = {"alpha": 2.0, "exit_layer": 6, "layer_top_k": [2] * 6, "dev": 80.0 + i + offset}
            variants[name].update({"STSBenchmark": 70.0 + i + offset, "SICK-R": 60.0 + 2 * i - offset})
        return {"homogeneity": {"upcycled": [0.5] * 6, "trained": [0.4 + offset / 10] * 6}, "variants": variants}

    (tmp_path / "aea").mkdir()
    for seed, offset in [(0, 0.0), (2, 1.0)]:
        (tmp_path / "aea" / f"s{seed}.json").write_text(json.dumps(seed_result(offset)))
    text = A.main(["--output", str(tmp_path), "--report-only", "--seeds", "0,1,2"])
    assert text == (tmp_path / "report.md").read_text() and text.startswith("Seeds 0, 2;")
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ") for line in text.splitlines() if line.startswith("| ")}
    # plain is variant index 1: STS-B 71 / 72, SICK-R 62 / 61, test means 66.5 / 66.5
    assert rows["plain"][1:5] == ["81.50 ± 0.71", "71.50 ± 0.71", "61.50 ± 0.71", "66.50 ± 0.00"]
    # aea (index 4): STS-B 74 / 75, SICK-R 68 / 67, so 71 and +4.5 over plain in both seeds
    assert rows["aea"][4:6] == ["71.00 ± 0.00", "+4.50 ± 0.00"]
    assert rows["0"][1:3] == ["0.500 ± 0.000", "0.450 ± 0.071 |"]
    with pytest.raises(SystemExit) as exit_info:  # no results: one line and exit 2
        A.run_cli(A.main, ["--output", str(tmp_path / "none"), "--report-only"])
    assert exit_info.value.code == 2


def test_recipe_is_the_recommended_variant_and_keeps_held_out_data_out():
    import yaml

    from experiments.forgetting import HELD_OUT, IN_DOMAIN, RECIPE, RECOMMENDED, VARIANT_KEYS, VARIANTS

    recipe = yaml.safe_load(RECIPE.read_text())
    chosen = {k: v for k, v in recipe.items() if k in VARIANT_KEYS and k not in ("model", "output_dir")}
    assert chosen == VARIANTS[RECOMMENDED]
    sources = [spec.get("path") or spec["hub"] for specs in recipe["tasks"].values() for spec in specs]
    # no split or source of a held-out task: Banking77, Emotion, TwitterURL, STS-B, SICK (nor MRPC and the
    # STS/SICK/TrecQA pairs of positive_pairs.jsonl), as a local file or a Hub dataset
    forbidden = ("banking77", "emotion", "twitter", "sts/", "stsbenchmark", "sick", "mrpc", "positive_pairs")
    assert len(sources) == 8 and not [s for s in sources if any(word in s.lower() for word in forbidden)]
    assert not set(IN_DOMAIN) & set(HELD_OUT)


def test_forgetting_report_splits_domains_and_pairs_with_the_untouched_model():
    from experiments.forgetting import split_report
    from moe_embed.evaluation.run import TASKS

    def scores(value):
        return {task: {"main_score": value} for task in TASKS}

    results = {
        "untouched (no prompts)": {None: scores(50.0)},
        "full": {0: scores(52.0), 1: scores(54.0)},
        "ic": {0: scores(51.0), 1: scores(51.0)},
    }
    text = split_report(results, list(TASKS))
    assert "in-domain (avg)" in text and "held-out (avg)" in text
    assert "| full − untouched (no prompts) |" in text and "+3.00 ± 1.41" in text  # (2, 4) against one model
    assert "| full − ic |" in text and "+2.00 ± 1.41" in text


def test_forgetting_report_only_reports_every_variant_with_results(tmp_path):
    """A plain --report-only run reports the variants that only run through --variants (MoE, CoMoE) too."""
    from experiments.forgetting import main
    from moe_embed.evaluation.run import TASKS

    results = tmp_path / "results"
    results.mkdir()
    for name, value in {"untouched": 50.0, "full-s0": 52.0, "moe+recipe-s0": 49.0}.items():
        (results / f"{name}.json").write_text(json.dumps({task: {"main_score": value} for task in TASKS}))
    text = main(["--output", str(tmp_path), "--report-only", "--seeds", "0"])
    assert "| moe+recipe − untouched (no prompts) |" in text and "| full − untouched (no prompts) |" in text


def test_shared_data_is_the_environment_folder_else_one_line(tmp_path, monkeypatch, capsys):
    from experiments.common import shared_data
    from moe_embed.errors import UsageError

    monkeypatch.setenv("MOE_EMBED_SHARED", str(tmp_path))
    assert shared_data() == tmp_path
    monkeypatch.setenv("MOE_EMBED_SHARED", str(tmp_path / "missing"))
    with pytest.raises(UsageError) as error:
        shared_data()
    message = str(error.value)
    assert "\n" not in message and str(tmp_path / "missing") in message and "$MOE_EMBED_SHARED" in message
    with pytest.raises(SystemExit) as exit_info:  # prepare_data --shared: the same one line, exit 2
        prepare_data.run_cli(prepare_data.main, ["--output", str(tmp_path / "out"), "--shared", str(tmp_path / "no")])
    assert exit_info.value.code == 2 and "--shared" in capsys.readouterr().err


@requires_shared_data
def test_hub_copies_of_the_shared_folder_are_read_as_the_hub_datasets(tmp_path, monkeypatch):
    from experiments.common import hub_data
    from moe_embed.data import load

    monkeypatch.setenv("MOE_EMBED_SHARED", str(SHARED_DATA))
    folder = hub_data(tmp_path)
    assert folder == tmp_path / "hubdata" and hub_data(tmp_path) == folder  # written once
    assert len(load("mteb/stsbenchmark-sts", None, "validation", folder=folder)) == 1500  # the shared dev split
    assert len(load("mteb/banking77", None, "test", folder=folder)) == 3080


def test_report_only_reads_results_written_under_the_old_task_names(tmp_path):
    from experiments.mote_vs_ic import main

    (tmp_path / "results").mkdir()
    for name, score in [("base", 40.0), ("ic-s0", 41.0)]:
        scores = {"TRECClustering (local)": {"main_score": score}}
        (tmp_path / "results" / f"{name}.json").write_text(json.dumps(scores))
    args = ["--output", str(tmp_path), "--report-only", "--tasks", "TRECClustering", "--variants", "ic", "--seeds", "0"]
    lines = main(args).splitlines()
    assert lines[0] == "| model | TRECClustering | Clustering (avg) | average | seeds |"
    assert lines[2:4] == ["| base (no prompts) | 40.00 | 40.00 | 40.00 | 1 |", "| ic | 41.00 | 41.00 | 41.00 | 1 |"]


def test_forgetting_trains_on_the_shared_files_and_selects_on_the_hub_copies(tmp_path, monkeypatch):
    from experiments import forgetting
    from moe_embed.training.config import TrainingConfig, from_mapping

    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("MOE_EMBED_SHARED", str(shared))
    monkeypatch.setattr(forgetting, "hub_data", lambda out: out / "hubdata")
    config = forgetting.config(tmp_path / "out", forgetting.RECOMMENDED, 1)
    paths = [spec["path"] for specs in config["tasks"].values() for spec in specs if "path" in spec]
    assert paths and all(path.startswith(f"{shared}/") for path in paths)  # no {data}/ left for --data-dir
    assert config["data_dir"] == str(tmp_path / "out" / "hubdata")  # the dev set stsb-dev and hub: datasets
    parsed = from_mapping(TrainingConfig, config)
    assert parsed.seed == 1 and parsed.dev.tasks == ["stsb-dev"] and parsed.trainable == "experts"


def test_aea_test_pairs_are_the_hub_datasets_test_split():
    from experiments.aea_moe_encoder import pairs_of

    first, second, scores = pairs_of("STSBenchmark", FIXTURE_DATA)
    rows = [json.loads(line) for line in (FIXTURE_DATA / "mteb/stsbenchmark-sts/test.jsonl").read_text().splitlines()]
    assert (first, second) == ([r["sentence1"] for r in rows], [r["sentence2"] for r in rows]) and len(rows) == 8
    assert scores == [float(r["score"]) for r in rows]


def test_a_dev_signal_is_clustered_as_the_suite_clusters_banking77(dense_path):
    from sentence_transformers import SentenceTransformer

    from experiments.dev_signals import clustering_task
    from moe_embed.data import load as load_rows
    from moe_embed.evaluation.tasks import get_task, load, score

    model = SentenceTransformer(dense_path)
    rows = load_rows("mteb/banking77", None, "test", folder=FIXTURE_DATA)
    signal = clustering_task("Banking77 test", list(rows["text"]), list(rows["label"]))
    assert score(model, signal) == pytest.approx(score(model, load(get_task("Banking77Clustering"), FIXTURE_DATA)))


def test_dev_signals_scores_stsb_dev_through_the_clustering_expert(mote_dir, tmp_path, capsys):
    import shutil

    from sentence_transformers import SentenceTransformer

    from experiments import dev_signals
    from moe_embed.evaluation.tasks import DEV_SETS, get_task, load

    data = tmp_path / "data"
    shutil.copytree(FIXTURE_DATA / "mteb/stsbenchmark-sts", data / "mteb/stsbenchmark-sts")
    for repo, split, text, label in dev_signals.CANDIDATES.values():
        _jsonl(data / repo / f"{split}.jsonl", [{text: f"{repo} text {i}", label: i % 2} for i in range(6)])
    rows = dev_signals.main([mote_dir, "--data-dir", str(data)])
    table = capsys.readouterr().out.splitlines()
    assert table[0] == "| model | Emotion val | SST-2 dev | TREC train (fine) | STS-B dev via clustering |"
    assert [line.split(" |")[0] for line in table[2:]] == ["| untouched", f"| {Path(mote_dir).name}"]
    assert len(rows) == 2 and all(len(row) == 4 and all(0 <= value <= 100 for value in row) for row in rows)
    model = SentenceTransformer(mote_dir, trust_remote_code=True)  # which experts encode STS-B dev
    tasks = model[0].auto_model.config.tasks
    ran = []
    model[0].register_forward_pre_hook(lambda module, args: ran.extend(tasks[i] for i in args[0]["task_ids"].tolist()))
    dev_signals.signals(model, {}, load(get_task(*DEV_SETS["stsb-dev"]), FIXTURE_DATA))
    assert ran and set(ran) == {"clustering"}


@requires_shared_data
def test_every_dataset_of_the_forgetting_recipe_is_in_the_shared_folder_or_its_copies(tmp_path, monkeypatch):
    from experiments import forgetting
    from moe_embed.data import local_copy
    from moe_embed.evaluation.tasks import DEV_SETS, get_task, repo_of

    monkeypatch.setenv("MOE_EMBED_SHARED", str(SHARED_DATA))
    config = forgetting.config(tmp_path, forgetting.RECOMMENDED, 0)
    specs = [spec for specs in config["tasks"].values() for spec in specs]
    hub = [spec["hub"] for spec in specs if "hub" in spec] + [repo_of(get_task(DEV_SETS["stsb-dev"][0]))]
    assert [spec["path"] for spec in specs if "path" in spec and not Path(spec["path"]).exists()] == []
    assert [repo for repo in hub if local_copy(repo, Path(config["data_dir"])) is None] == []


def test_clustering_protocols_trace_mtebs_score_to_the_seed_42_run(dense_path, capsys):
    """mteb's single-set clustering is the former protocol's first run (seed 42), not its 10-seed mean."""
    from experiments.clustering_protocols import main

    (row,) = main([dense_path, "--tasks", "Banking77Clustering", "--data-dir", str(FIXTURE_DATA)])
    assert row["task"] == "Banking77Clustering" and row["mteb"] == pytest.approx(row["seed42"], abs=1e-9)
    assert "| Banking77Clustering |" in capsys.readouterr().out
