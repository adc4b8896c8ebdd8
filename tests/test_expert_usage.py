"""moe_embed.evaluation.expert_usage: routing shares and expert-output cosines per layer, table, plot and CLI."""

import json

import pytest
import torch
from conftest import TEXTS, randomize_lora_b, run_main, sharpen_routers, top_k_margin
from sentence_transformers import SentenceTransformer

from moe_embed.evaluation.expert_usage import expert_usage, main, mean_pairwise_cosine, table, task_texts


@pytest.fixture
def trained_comoe(comoe_dir):
    """The upcycled CoMoE with random B (experts that differ) and routers far from ties."""
    model = SentenceTransformer(comoe_dir, trust_remote_code=True)
    randomize_lora_b(model[0].auto_model, seed=3)
    sharpen_routers(model[0].auto_model, seed=3)
    return model


def test_shares_are_the_models_own_routing_per_layer_and_padding_is_not_counted(trained_comoe):
    transformer = trained_comoe[0].auto_model
    config = transformer.config
    texts = TEXTS[:6]
    counts = torch.zeros(len(config.adapted_linears()), config.num_local_experts, dtype=torch.long)
    with torch.no_grad():
        for text in texts:  # one text at a time: no padding
            features = trained_comoe.preprocess([text])
            out = transformer(features["input_ids"], features["attention_mask"], output_router_logits=True)
            assert top_k_margin(out.router_logits, config.num_experts_per_tok) > 1e-3
            counts += out.expert_counts
    per_layer = counts.view(config.num_hidden_layers, len(config.target_modules), -1).sum(dim=1)
    expected = per_layer / per_layer.sum(dim=1, keepdim=True)

    batched = expert_usage(trained_comoe, texts, batch_size=6)  # one padded batch
    assert [row["layer"] for row in batched] == list(range(config.num_hidden_layers))
    for row, want in zip(batched, expected, strict=True):
        assert row["shares"] == pytest.approx(want.tolist(), abs=1e-12)
        assert sum(row["shares"]) == pytest.approx(1.0)
    real_tokens = sum(len(trained_comoe.preprocess([t])["input_ids"][0]) for t in texts)
    assert all(row["tokens"] == real_tokens for row in batched)
    one_by_one = expert_usage(trained_comoe, texts, batch_size=1)
    for a, b in zip(batched, one_by_one, strict=True):
        assert a["shares"] == b["shares"]
        assert a["cosine"] == pytest.approx(b["cosine"], abs=1e-5)


def test_cosine_is_one_for_identical_experts_and_zero_for_orthogonal_outputs(trained_comoe):
    transformer = trained_comoe[0].auto_model
    with torch.no_grad():
        for linear in (transformer.get_submodule(n) for n in transformer.config.adapted_linears()):
            layer = int(next(n for n, m in transformer.named_modules() if m is linear).split(".")[2])
            if layer == 0:  # every expert a copy of expert 0
                linear.lora_A.copy_(linear.lora_A[:1].expand_as(linear.lora_A))
                linear.lora_B.copy_(linear.lora_B[:1].expand_as(linear.lora_B))
            elif layer == 1:  # expert i writes only output rows i, i + E, i + 2E, ...: orthogonal outputs
                experts, out = linear.lora_B.shape[:2]
                keep = torch.arange(out).unsqueeze(0) % experts == torch.arange(experts).unsqueeze(1)
                linear.lora_B.mul_(keep.unsqueeze(-1))
    rows = expert_usage(trained_comoe, TEXTS[:4], batch_size=2)
    assert rows[0]["cosine"] == pytest.approx(1.0, abs=1e-5)
    assert rows[1]["cosine"] == pytest.approx(0.0, abs=1e-6)
    assert all(-1.0 <= row["cosine"] < 0.99 for row in rows[2:])
    assert "| 0 |" in table(rows) and "1.000 |" in table(rows)


def test_upcycled_outputs_are_zero_so_the_cosine_is_undefined(comoe_dir):
    rows = expert_usage(SentenceTransformer(comoe_dir, trust_remote_code=True), TEXTS[:3])
    assert all(row["cosine"] is None for row in rows)
    assert "| — |" in table(rows)
    assert mean_pairwise_cosine(torch.zeros(5, 4, 8)) == (0.0, 0)


def test_token_routed_moe_identical_experts(moe_dir):
    """The upcycled MoE's experts are copies of the dense FFN: cosine 1 in every MoE layer."""
    model = SentenceTransformer(moe_dir, trust_remote_code=True)
    rows = expert_usage(model, TEXTS[:4], batch_size=4)
    assert [row["layer"] for row in rows] == model[0].auto_model.config.moe_layers
    for row in rows:
        assert row["cosine"] == pytest.approx(1.0, abs=1e-5)
        assert sum(row["shares"]) == pytest.approx(1.0) and len(row["shares"]) == 8


def test_cli_writes_tables_json_and_plot(trained_comoe, fixture_data, tmp_path, capsys):
    folder = tmp_path / "trained"
    trained_comoe.save(str(folder))
    code, err = run_main(
        main,
        str(folder),
        "--tasks",
        "STSBenchmark,SciFact",
        "--data-dir",
        str(fixture_data),
        "--max-texts",
        "8",
        "--output",
        str(tmp_path / "usage.json"),
        "--plot",
        str(tmp_path / "usage.png"),
        capsys=capsys,
    )
    assert code == 0, err
    saved = json.loads((tmp_path / "usage.json").read_text())
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    assert list(saved) == ["STSBenchmark", "SciFact"] and len(saved["SciFact"]) == layers  # one row a layer
    assert all(row["cosine"] is not None and row["tokens"] > 0 for rows in saved.values() for row in rows)
    assert (tmp_path / "usage.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_a_model_without_routing(dense_path, fixture_data, capsys):
    code, err = run_main(main, dense_path, "--tasks", "STSBenchmark", "--data-dir", str(fixture_data), capsys=capsys)
    assert code == 2
    assert "expected a token-routed model (model_type comoe_bert or moe_bert), got 'bert'" in err
    code, err = run_main(main, dense_path, "--tasks", "NoSuchTask", capsys=capsys)
    assert code == 2 and "unknown tasks ['NoSuchTask']" in err


def test_each_text_carries_the_prompt_mteb_evaluates_it_with(moe_dir, fixture_data, monkeypatch):
    """The report's texts carry the prompt that mteb's Sentence-Transformers wrapper sends with them: a task name's
    prompt before its type's (STSBenchmark), a task name and prompt type (SciFact's queries) before the prompt type
    (its documents), and the model's default prompt where mteb finds none (Banking77, no Classification prompt)."""
    from datasets import Dataset
    from mteb.models.sentence_transformer_wrapper import SentenceTransformerEncoderWrapper
    from mteb.types import PromptType
    from torch.utils.data import DataLoader

    from moe_embed.evaluation.run import load_tasks

    model = SentenceTransformer(moe_dir, trust_remote_code=True)
    model.prompts = {
        "query": "q: ",
        "document": "d: ",
        "SciFact-query": "scifact q: ",
        "STS": "s: ",
        "STSBenchmark": "b: ",
    }
    model.default_prompt_name = "document"
    wrapper = SentenceTransformerEncoderWrapper(model)
    sent = []
    preprocess = model.preprocess

    def recording(inputs, prompt=None, **kwargs):
        sent.append(prompt)
        return preprocess(inputs, prompt=prompt, **kwargs)

    monkeypatch.setattr(model, "preprocess", recording)

    def mteb_sends(task, prompt_type=None) -> str:
        sent.clear()
        texts = DataLoader(Dataset.from_dict({"text": ["a text"]}), batch_size=1)
        wrapper.encode(
            texts, task_metadata=task.metadata, hf_split="test", hf_subset="default", prompt_type=prompt_type
        )
        assert sent and sent[0]
        return sent[0]

    def prompts_of(texts: list[str], known: set[str]) -> set[str]:
        return {next(p for p in sorted(known, key=len, reverse=True) if t.startswith(p)) for t in texts}

    known = set(model.prompts.values())
    tasks = load_tasks(["STSBenchmark", "SciFact", "Banking77Classification"], str(fixture_data))
    for name in ("STSBenchmark", "Banking77Classification"):
        texts = task_texts(tasks[name], model, max_texts=6, seed=0)
        assert len(texts) == 6 and prompts_of(texts, known) == {mteb_sends(tasks[name])}, name
    texts = task_texts(tasks["SciFact"], model, max_texts=6, seed=0)  # queries, then documents
    assert prompts_of(texts[:3], known) == {mteb_sends(tasks["SciFact"], PromptType.query)}
    assert prompts_of(texts[3:], known) == {mteb_sends(tasks["SciFact"], PromptType.document)}
