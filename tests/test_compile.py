"""torch.compile: one graph for a named task, no recompilation across task mixes, eager's outputs."""

import pytest
import torch
import torch._dynamo
from conftest import tiny_family_model, tiny_mote_config, tiny_prefix_ids

from moe_embed.modeling.modeling_mote import MoteBertModel

# search_query:, search_document:, classification:, clustering: (with [CLS]), in the tasks' order
PREFIXES = list(tiny_prefix_ids().values())


class CountingBackend:
    """A torch.compile backend that runs each captured graph as it is and counts them."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, graph_module, example_inputs):
        self.graphs += 1
        return graph_module.forward


def mixed_batch(tasks: list[int], seq_len: int = 12) -> dict:
    generator = torch.Generator().manual_seed(len(tasks) * 10 + sum(tasks))
    ids = torch.randint(1000, 2000, (len(tasks), seq_len), generator=generator)  # none starts a prefix
    for row, task in enumerate(tasks):
        ids[row, : len(PREFIXES[task])] = torch.tensor(PREFIXES[task])
    mask = torch.ones_like(ids)
    mask[0, -3:] = 0  # one padded row
    return {"input_ids": ids, "attention_mask": mask}


MIXES = [[0, 1, 2, 3], [0, 0, 1, 1], [3, 3, 2, 3], [2, 2, 2, 2], [1, 0, 3, 2]]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.fixture()
def model():
    torch.manual_seed(0)
    return MoteBertModel(tiny_mote_config(default_task="classification")).eval()


def test_named_task_compiles_to_one_full_graph(model):
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)  # fullgraph: a graph break raises
    with torch.no_grad():
        for tasks in MIXES:
            batch = mixed_batch(tasks)
            got = compiled(**batch, task="query").last_hidden_state
            assert torch.allclose(got, model(**batch, task="query").last_hidden_state, atol=1e-5)
    assert backend.graphs == 1


def test_mixed_task_batches_do_not_recompile_per_task_mix(model):
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        counts = []
        for tasks in MIXES:
            batch = mixed_batch(tasks)
            out = compiled(**batch)
            assert out.task_ids.tolist() == tasks
            assert torch.allclose(out.last_hidden_state, model(**batch).last_hidden_state, atol=1e-5)
            counts.append(backend.graphs)
    # the routing's data-dependent row counts break the graph; after one recompile with dynamic sizes,
    # no new task mix compiles anything
    assert counts[1] == counts[-1]


def test_mixed_tasks_are_one_graph_with_dynamic_output_shapes(model):
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        for tasks in MIXES:
            batch = mixed_batch(tasks)
            assert torch.allclose(compiled(**batch).last_hidden_state, model(**batch).last_hidden_state, atol=1e-5)
    assert backend.graphs == 1


def test_token_routed_moe_compiles_with_dynamic_output_shapes():
    model = tiny_family_model("moe_bert").eval()
    backend = CountingBackend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        for seed in range(3):
            ids = torch.randint(5, 120, (3, 9), generator=torch.Generator().manual_seed(seed))
            mask = torch.ones_like(ids)
            mask[seed, 5:] = 0
            expected = model(input_ids=ids, attention_mask=mask).last_hidden_state
            got = compiled(input_ids=ids, attention_mask=mask).last_hidden_state
            assert torch.allclose(got[mask.bool()], expected[mask.bool()], atol=1e-5)
    assert backend.graphs == 1
