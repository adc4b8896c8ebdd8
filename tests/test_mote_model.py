"""MoteBertModel: equivalence with the dense model after upcycling, expert isolation, routing."""

import threading

import pytest
import torch
from conftest import TEXTS, randomize_experts, tiny_mote_config

from moe_embed.modeling.modeling_mote import MoteBertModel
from moe_embed.modeling.task_router import TaskRouter

TASKS = ["query", "document", "classification", "clustering"]


def _prefixed(model, task, texts=TEXTS):
    return [model.config.task_prefixes[task] + t for t in texts]


@pytest.mark.parametrize("task", TASKS)
def test_upcycled_equals_dense_for_every_task(mote_model, dense_model, tokenizer, task):
    batch = tokenizer(_prefixed(mote_model, task), padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = dense_model(**batch)
        by_prefix = mote_model(**batch)
        by_name = mote_model(**batch, task=task)
    mask = batch["attention_mask"].bool()
    for out in (by_prefix, by_name):
        assert (out.last_hidden_state - expected.last_hidden_state)[mask].abs().max() <= 1e-5
        assert (out.pooler_output - expected.pooler_output).abs().max() <= 1e-5
    assert by_prefix.task_ids.tolist() == [TASKS.index(task)] * len(TEXTS)


def test_perturbing_one_expert_changes_only_its_task(mote_model, tokenizer):
    batches = {t: tokenizer(_prefixed(mote_model, t), padding=True, return_tensors="pt") for t in TASKS}
    with torch.no_grad():
        before = {t: mote_model(**b, task=t).last_hidden_state for t, b in batches.items()}
        target = TASKS.index("classification")
        for layer in mote_model.config.expert_layers:
            expert = mote_model.encoder.layer[layer].experts[str(target)]
            expert.intermediate.dense.weight.mul_(1.5)
            expert.attention_LayerNorm.bias.add_(0.1)
        after = {t: mote_model(**b, task=t).last_hidden_state for t, b in batches.items()}
    for task in TASKS:
        changed = not torch.equal(before[task], after[task])
        assert changed == (task == "classification"), task


def test_mixed_task_batch_equals_per_task_rows():
    torch.manual_seed(0)
    model = MoteBertModel(tiny_mote_config()).eval()
    randomize_experts(model)
    input_ids = torch.randint(1000, 2000, (6, 9))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0  # padding in some rows
    attention_mask[4, 3:] = 0
    tasks = ["clustering", "query", "clustering", "document", "query", "classification"]
    with torch.no_grad():
        mixed = model(input_ids=input_ids, attention_mask=attention_mask, task=tasks)
        for row, task in enumerate(tasks):
            alone = model(input_ids=input_ids[row : row + 1], attention_mask=attention_mask[row : row + 1], task=task)
            keep = attention_mask[row].bool()
            diff = (mixed.last_hidden_state[row, keep] - alone.last_hidden_state[0, keep]).abs().max()
            assert diff <= 1e-5, (row, task, diff)
            assert (mixed.pooler_output[row] - alone.pooler_output[0]).abs().max() <= 1e-5
    assert mixed.task_ids.tolist() == [TASKS.index(t) for t in tasks]
    # the experts really differ, so routing a row elsewhere would have shown
    with torch.no_grad():
        other = model(input_ids=input_ids, attention_mask=attention_mask, task="query")
    assert (other.last_hidden_state[0] - mixed.last_hidden_state[0]).abs().max() > 1e-3


def test_hidden_states_come_back_in_input_order():
    model = MoteBertModel(tiny_mote_config()).eval()
    randomize_experts(model)
    input_ids = torch.randint(1000, 2000, (3, 5))
    tasks = ["clustering", "document", "query"]  # sorting by task is a 3-cycle, not its own inverse
    with torch.no_grad():
        out = model(input_ids=input_ids, task=tasks, output_hidden_states=True)
        rows = [model(input_ids=input_ids[i : i + 1], task=t, output_hidden_states=True) for i, t in enumerate(tasks)]
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    for layer, hidden in enumerate(out.hidden_states):
        for i, row in enumerate(rows):
            assert (hidden[i] - row.hidden_states[layer][0]).abs().max() <= 1e-5, (layer, i)


def test_too_long_input_is_a_clear_error():
    model = MoteBertModel(tiny_mote_config(max_position_embeddings=16)).eval()
    with pytest.raises(ValueError, match="Input of 20 tokens is longer than the 16 positions"):
        model(input_ids=torch.randint(1000, 2000, (1, 20)), task="query")


def test_routing_sources_and_precedence(tokenizer):
    model = MoteBertModel(tiny_mote_config()).eval()
    randomize_experts(model)
    texts = ["search_query: who", "search_document: a page", "clustering: cats", "classification: ok"]
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        detected = model(**batch).task_ids.tolist()
        assert detected == [0, 1, 3, 2]
        assert model(**batch, task="document").task_ids.tolist() == [1, 1, 1, 1]
        assert model(**batch, task_ids=torch.tensor([3, 3, 0, 0])).task_ids.tolist() == [3, 3, 0, 0]
        assert model(**batch, task_ids=2).task_ids.tolist() == [2, 2, 2, 2]
        # explicit task wins over task_ids, and aliases resolve
        assert model(**batch, task="passage", task_ids=0).task_ids.tolist() == [1, 1, 1, 1]
        assert model(**batch, task="sts").task_ids.tolist() == [2, 2, 2, 2]


def test_default_task_and_unknown_task_errors(tokenizer):
    batch = tokenizer(["no prefix here", "search_query: who"], padding=True, return_tensors="pt")
    strict = MoteBertModel(tiny_mote_config()).eval()
    with pytest.raises(
        ValueError,
        match=r"Cannot tell the task of 1 of 2 rows \(rows \[0\] of this batch\).*'query' \(prefix 'search_query: '\)",
    ):
        strict(**batch)
    with pytest.raises(ValueError, match=r"Unknown task 'reranking'.*Valid tasks: 'query'"):
        strict(**batch, task="reranking")
    with pytest.raises(ValueError, match="2 rows"):
        strict(**batch, task=["query"])
    with pytest.raises(ValueError, match=r"task_ids` must lie in -1\.\.3"):
        strict(**batch, task_ids=torch.tensor([0, 7]))
    lenient = MoteBertModel(tiny_mote_config(default_task="clustering")).eval()
    assert lenient(**batch).task_ids.tolist() == [3, 0]
    # a task id beats the prefix; -1 reads the row's prefix, else the default
    assert lenient(**batch, task_ids=torch.tensor([-1, 1])).task_ids.tolist() == [3, 1]
    assert lenient(**batch, task_ids=torch.tensor([-1, -1])).task_ids.tolist() == [3, 0]
    with pytest.raises(ValueError, match="Cannot tell the task of 1 of 2 rows"):
        strict(**batch, task_ids=torch.tensor([-1, 2]))


def test_config_validation_errors():
    with pytest.raises(ValueError, match="out of range"):
        tiny_mote_config(expert_layers=[1, 9])
    with pytest.raises(ValueError, match="at least one layer"):
        tiny_mote_config(expert_layers=[])
    with pytest.raises(ValueError, match="lacks a prefix"):
        tiny_mote_config(tasks=["query", "legal"], task_prefixes={"query": "q: "}, task_prefix_ids=None)
    with pytest.raises(ValueError, match="Unknown task 'nope'"):
        tiny_mote_config(default_task="nope")
    assert tiny_mote_config(expert_layers="all").expert_layers == [0, 1, 2, 3]
    assert tiny_mote_config(expert_layers="every_other").expert_layers == [1, 3]
    assert tiny_mote_config(expert_layers="0,2").expert_layers == [0, 2]


def test_task_names_resolve_in_any_case_where_they_name_one_expert():
    config = tiny_mote_config()
    assert [config.task_index(name) for name in ("Classification", "CLUSTERING", "Passage", "STS")] == [2, 3, 1, 2]
    assert tiny_mote_config(default_task="Clustering").default_task == "clustering"
    cased = tiny_mote_config(
        tasks=["Legal", "LEGAL"], task_prefixes={"Legal": "l: ", "LEGAL": "L: "}, task_prefix_ids=None
    )
    assert (cased.task_index("Legal"), cased.task_index("LEGAL")) == (0, 1)  # the exact spelling first
    with pytest.raises(ValueError, match=r"Task 'legal' is ambiguous: it names the tasks \['LEGAL', 'Legal'\]"):
        cased.task_index("legal")


def test_eager_and_sdpa_agree(tokenizer):
    config = tiny_mote_config()
    model = MoteBertModel(config).eval()
    randomize_experts(model)
    batch = tokenizer(["search_query: a b c d e", "clustering: x"], padding=True, return_tensors="pt")
    with torch.no_grad():
        model.config._attn_implementation = "sdpa"
        sdpa = model(**batch).last_hidden_state
        model.config._attn_implementation = "eager"
        eager = model(**batch, output_attentions=True)
    mask = batch["attention_mask"].bool()
    assert (sdpa - eager.last_hidden_state)[mask].abs().max() <= 1e-5
    # padded keys get no attention
    assert eager.attentions[0][1, :, :, ~mask[1]].abs().max() == 0


def test_gradients_reach_only_the_routed_expert():
    model = MoteBertModel(tiny_mote_config()).train()
    input_ids = torch.randint(1000, 2000, (4, 6))
    out = model(input_ids=input_ids, task=["query", "query", "clustering", "query"]).last_hidden_state
    # a random projection: a plain sum of LayerNorm outputs has zero gradient
    (out * torch.randn(out.shape)).sum().backward()
    for layer in model.config.expert_layers:
        grads = [
            any(p.grad is not None and p.grad.abs().sum() > 0 for p in e.parameters())
            for e in model.encoder.layer[layer].experts.values()
        ]
        assert grads == [True, False, False, True]


@pytest.mark.slow
def test_concurrent_encodes_with_different_tasks_match_sequential(mote_model, tokenizer):
    randomize_experts(mote_model)
    jobs = [(task, TEXTS[i % len(TEXTS)]) for i, task in enumerate(TASKS * 2)]
    batches = [tokenizer([text], return_tensors="pt") for _, text in jobs]
    with torch.no_grad():
        sequential = [mote_model(**b, task=t).last_hidden_state for (t, _), b in zip(jobs, batches, strict=True)]
    results = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def work(i):
        barrier.wait()
        with torch.no_grad():
            for _ in range(3):
                results[i] = mote_model(**batches[i], task=jobs[i][0]).last_hidden_state

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i, expected in enumerate(sequential):
        assert torch.equal(results[i], expected), jobs[i]


def test_empty_batch_is_a_clear_error():
    model = MoteBertModel(tiny_mote_config()).eval()
    with pytest.raises(ValueError, match="empty batch"):
        model(input_ids=torch.zeros((0, 4), dtype=torch.long), task="query")


def test_gradient_checkpointing_gives_the_same_gradients():
    torch.manual_seed(0)
    model = MoteBertModel(tiny_mote_config()).train()
    input_ids = torch.randint(1000, 2000, (3, 6))
    weights = torch.randn(3, 6, 32)

    def grads():
        model.zero_grad()
        out = model(input_ids=input_ids, task=["query", "clustering", "query"]).last_hidden_state
        (out * weights).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    model.activation_checkpointing_enable()
    assert all(layer.gradient_checkpointing for layer in model.encoder.layer)
    checkpointed = grads()
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name


def test_return_dict_false_gives_a_tuple():
    model = MoteBertModel(tiny_mote_config()).eval()
    ids = torch.randint(1000, 2000, (2, 5))
    with torch.no_grad():
        as_tuple = model(input_ids=ids, task="query", return_dict=False)
        as_output = model(input_ids=ids, task="query")
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], as_output.last_hidden_state)


def test_a_row_takes_the_longest_prefix_it_starts_with():
    # nested prefixes (one task's is the start of another's), rows shorter than a prefix, a row with none
    prefix_ids = {"query": [101, 7, 8], "document": [101, 7, 8, 9], "classification": [101, 5], "clustering": [101, 6]}
    config = tiny_mote_config(task_prefix_ids=prefix_ids)
    rows = [[101, 7, 8, 9, 4], [101, 7, 8, 4, 4], [101, 7, 8], [101, 7], [101, 5, 9, 9, 9], [101, 4, 4, 4, 4]]
    width = max(len(r) for r in rows)
    input_ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])

    def expected(row):  # the rule, read directly: the longest prefix the row starts with
        hits = [t for t, ids in prefix_ids.items() if row[: len(ids)] == ids]
        return config.tasks.index(max(hits, key=lambda t: len(prefix_ids[t]))) if hits else -1

    want = [expected(r.tolist()) for r in input_ids]
    assert want == [1, 0, 0, -1, 2, -1]  # the cases above, as the reading says
    found, length = TaskRouter(config).match(input_ids)
    assert found.tolist() == want
    assert length.tolist() == [4, 3, 3, 0, 2, 0]
    assert TaskRouter(config).match(input_ids[:, :2])[0].tolist() == [-1, -1, -1, -1, 2, -1]  # too short for most


def test_the_router_sorts_a_batch_by_expert_and_puts_it_back():
    """`route_batch` gives the forward what it needs: the rows in expert order (a stable sort), the segments each
    expert layer reads, and `restore` putting outputs back in the caller's order; a named task is one segment and
    no sort, and an expert the model does not hold is refused before anything runs."""
    from types import SimpleNamespace

    prefix_ids = {"query": [101, 7], "document": [101, 8], "classification": [101, 5], "clustering": [101, 6]}
    router = TaskRouter(tiny_mote_config(task_prefix_ids=prefix_ids))
    input_ids = torch.tensor([[101, 6, 1], [101, 7, 2], [101, 6, 3], [101, 8, 4], [101, 7, 5]])
    asked = []
    batch = router.route_batch(input_ids, None, None, None, check_experts=asked.append)
    assert batch.task_ids.tolist() == [3, 0, 3, 1, 0] and asked == [[0, 1, 3]]
    (sorted_ids,) = batch.take(input_ids)
    assert sorted_ids[:, 2].tolist() == [2, 5, 4, 1, 3]  # query rows, document, clustering; each in input order
    assert batch.routing.segments == ((0, 0, 2), (1, 2, 3), (3, 3, 5))
    encoded = SimpleNamespace(
        last_hidden_state=sorted_ids.float(), pooler_output=None, hidden_states=None, attentions=None
    )
    assert torch.equal(batch.restore(encoded)["last_hidden_state"], input_ids.float())
    named = router.route_batch(input_ids, None, None, None, task="Clustering", check_experts=asked.append)
    assert named.order is None and named.routing.segments == ((3, 0, 5),) and asked[-1] == [3]

    def missing(experts):
        raise ValueError(f"not loaded: {experts}")

    with pytest.raises(ValueError, match=r"not loaded: \[3\]"):
        router.route_batch(input_ids, None, None, None, task="clustering", check_experts=missing)
