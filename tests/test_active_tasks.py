"""Loading only some tasks' experts, and dropping or offloading experts of a loaded model."""

import pytest
import torch
from conftest import TEXTS, randomize_experts

from moe_embed.modeling.modeling_mote import MoteBertModel


@pytest.fixture()
def trained_dir(mote_dir, tmp_path):
    model = MoteBertModel.from_pretrained(mote_dir)
    randomize_experts(model, seed=4)
    model.save_pretrained(tmp_path / "trained")
    return tmp_path / "trained"


def _batch(tokenizer, task):
    return tokenizer(
        [{"query": "search_query: ", "clustering": "clustering: "}[task] + t for t in TEXTS],
        padding=True,
        return_tensors="pt",
    )


def test_active_tasks_loads_only_their_experts(trained_dir, tokenizer, caplog):
    full = MoteBertModel.from_pretrained(trained_dir).eval()
    one = MoteBertModel.from_pretrained(trained_dir, active_tasks=["query"]).eval()
    names = [n for n, _ in one.named_parameters() if ".experts." in n]
    assert names and all(".experts.0." in n for n in names)
    dense_count = sum(p.numel() for n, p in full.named_parameters() if ".experts." not in n or ".experts.0." in n)
    assert sum(p.numel() for p in one.parameters()) == dense_count
    assert "unexpected" not in caplog.text.lower()
    batch = _batch(tokenizer, "query")
    with torch.no_grad():
        assert torch.equal(one(**batch).last_hidden_state, full(**batch).last_hidden_state)
        with pytest.raises(
            ValueError, match=r"Task 'clustering' is not loaded: this model holds the experts of \['query'\]"
        ):
            one(**_batch(tokenizer, "clustering"))
        with pytest.raises(ValueError, match="Task 'document' is not loaded"):
            one(**batch, task="passage")


def test_active_tasks_survives_save_and_load(trained_dir, tmp_path):
    one = MoteBertModel.from_pretrained(trained_dir, active_tasks=["clustering", "query"])
    assert one.config.active_tasks == ["query", "clustering"]
    one.save_pretrained(tmp_path / "two")
    again = MoteBertModel.from_pretrained(tmp_path / "two")
    assert sorted(again.encoder.layer[1].experts.keys()) == ["0", "3"]


def test_set_active_tasks_drops_or_offloads(trained_dir, tokenizer):
    full = MoteBertModel.from_pretrained(trained_dir).eval()
    with torch.no_grad():
        expected = full(**_batch(tokenizer, "clustering")).last_hidden_state
    model = MoteBertModel.from_pretrained(trained_dir).eval()
    model.set_active_tasks(["clustering"], offload_device="meta")
    assert model.encoder.layer[1].experts["0"].output.dense.weight.device.type == "meta"
    with torch.no_grad():
        assert torch.equal(model(**_batch(tokenizer, "clustering")).last_hidden_state, expected)
        with pytest.raises(ValueError, match="experts of task 'query' are offloaded to meta"):
            model(**_batch(tokenizer, "query"))
    model.set_active_tasks(["clustering"])  # drop the others
    assert sorted(model.encoder.layer[1].experts.keys()) == ["3"] and model.config.active_tasks == ["clustering"]
    with pytest.raises(ValueError, match=r"experts of tasks \['query'\] were dropped"):
        model.set_active_tasks(["query"])


def test_active_tasks_validation(trained_dir):
    with pytest.raises(ValueError, match="Unknown task 'legal'"):
        MoteBertModel.from_pretrained(trained_dir, active_tasks=["legal"])


def test_sentence_transformers_with_one_task(mote_dir):
    from sentence_transformers import SentenceTransformer

    full = SentenceTransformer(mote_dir, trust_remote_code=True)
    one = SentenceTransformer(mote_dir, trust_remote_code=True, model_kwargs={"active_tasks": ["query"]})
    assert sum(p.numel() for p in one.parameters()) < sum(p.numel() for p in full.parameters())
    assert torch.equal(
        one.encode_query(TEXTS, convert_to_tensor=True), full.encode_query(TEXTS, convert_to_tensor=True)
    )
    with pytest.raises(ValueError, match="Task 'document' is not loaded"):
        one.encode_document(TEXTS)


# the tiny model: expert layer 1 in memory, 3 on disk; all on disk
@pytest.mark.parametrize("max_memory", ["380KB", "1KB"])
def test_disk_offload_through_device_map(trained_dir, tokenizer, tmp_path, max_memory):
    """`device_map` + `max_memory` small enough to put expert layers on disk: accelerate brings each
    layer's weights at its forward, and a mixed-task batch gives the in-memory model's outputs."""
    full = MoteBertModel.from_pretrained(trained_dir).eval()
    offloaded = MoteBertModel.from_pretrained(
        trained_dir, device_map="auto", max_memory={"cpu": max_memory}, offload_folder=str(tmp_path)
    ).eval()
    placed = offloaded.hf_device_map
    assert "disk" in placed.values() and (max_memory == "1KB" or placed["encoder.layer.1"] == "cpu")
    batch = tokenizer(
        ["search_query: who is newton", "clustering: stocks fell", "plain text"], padding=True, return_tensors="pt"
    )
    with torch.no_grad():
        assert torch.allclose(offloaded(**batch).last_hidden_state, full(**batch).last_hidden_state, atol=1e-6)
        assert torch.allclose(
            offloaded(**batch, task="document").last_hidden_state,
            full(**batch, task="document").last_hidden_state,
            atol=1e-6,
        )
