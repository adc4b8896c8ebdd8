"""convert/graph_prompts.py: on token ids, what `SentenceTransformer.encode` does to a MoTE input (routing,
the prefix put in or taken off, truncation), checked against `encode` itself in PyTorch."""

import pytest
import torch
from conftest import TEXTS, save_trained_copy
from sentence_transformers import SentenceTransformer

from convert.graph_prompts import PromptInputs, leading_specials

LONG = " ".join(["the quick brown fox jumps over the lazy dog"] * 6)  # far over the 24 tokens below
MAX = 24


def _client_tokens(tokenizer, texts, longest):
    """What a client sends: the text (its prompt in front or not), truncated at the folder's input length."""
    batch = tokenizer(texts, padding=True, truncation=True, max_length=MAX + longest, return_tensors="pt")
    return batch["input_ids"], batch["attention_mask"]


@pytest.fixture(scope="module", params=[False, True], ids=["prefix-fed", "prefix-routes-only"])
def folder(request, dense_path, tmp_path_factory):
    from convert.upcycle import main

    out = tmp_path_factory.mktemp("graph-prompts") / "mote"
    main(["--base", dense_path, "--output", str(out), *(["--prefix-routes-only"] if request.param else [])])
    trained = tmp_path_factory.mktemp("graph-prompts") / "trained"
    save_trained_copy(str(out), trained, seed=3)  # experts differ: a wrong route shows
    model = SentenceTransformer(str(trained), trust_remote_code=True)
    model.max_seq_length = MAX
    return model, request.param


def _graph_embed(model, strip, texts, task_ids=None):
    transformer = model[0]
    config, tokenizer = transformer.auto_model.config, transformer.tokenizer
    inputs = PromptInputs(
        config, leading_specials(config, tokenizer), MAX, tokenizer.sep_token_id, tokenizer.pad_token_id, strip
    )
    ids, mask = _client_tokens(tokenizer, texts, inputs.longest)
    given = None if task_ids is None else torch.tensor(task_ids)
    with torch.no_grad():
        ids, mask, task = inputs(ids, mask, given)
        out = transformer.auto_model(input_ids=ids, attention_mask=mask, task_ids=task)
        features = {"token_embeddings": out.last_hidden_state, "attention_mask": mask}
        for module in list(model)[1:]:
            features = module(features)
    return features["sentence_embedding"], task


@pytest.mark.parametrize("prompt_name", [None, "query", "document", "classification", "clustering"])
def test_ids_route_and_embed_as_encode_does(folder, prompt_name):
    model, strip = folder
    texts = [TEXTS[0], LONG, TEXTS[2], "hi"]
    expected = model.encode(texts, prompt_name=prompt_name, convert_to_tensor=True)
    prompt = model.prompts[prompt_name] if prompt_name else ""
    got, task = _graph_embed(model, strip, [prompt + t for t in texts])
    config = model[0].auto_model.config
    assert task.tolist() == [config.tasks.index(prompt_name or config.default_task)] * len(texts)
    assert (got - expected).abs().max() <= 1e-5


def test_a_mixed_batch_and_explicit_task_ids(folder):
    model, strip = folder
    config = model[0].auto_model.config
    names = ["query", "document", "clustering"]
    texts = [model.prompts["query"] + TEXTS[0], model.prompts["document"] + LONG, "an unprefixed text"]
    got, task = _graph_embed(model, strip, texts + [TEXTS[1]], task_ids=[-1, -1, config.tasks.index("clustering"), -1])
    expected = [
        model.encode([t[len(model.prompts[n]) :] if n != "clustering" else t], prompt_name=n, convert_to_tensor=True)[0]
        for n, t in zip(names, texts, strict=True)
    ]
    expected.append(model.encode([TEXTS[1]], convert_to_tensor=True)[0])
    assert task.tolist() == [config.tasks.index(n) for n in names] + [config.tasks.index(config.default_task)]
    assert (got - torch.stack(expected)).abs().max() <= 1e-5


def test_the_graph_reads_every_prefix_in_the_same_ops():
    """Prefix detection in a traced graph is a few ops whatever the number of tasks: per task, onnxruntime would
    run its own compare, reduce and select on every request."""
    from conftest import tiny_mote_config

    from modeling.modeling_mote import detect_task_ids

    class Detect(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

        def forward(self, input_ids):
            return detect_task_ids(input_ids, self.config)

    def node_count(tasks):
        prefixes = {task: [101, 2000 + index, 1024] for index, task in enumerate(tasks)}
        config = tiny_mote_config(tasks=tasks, task_prefix_ids=prefixes, task_prefixes=None, default_task=None)
        ids = torch.tensor([[101, 2001, 1024, 7], [101, 5, 6, 7]])
        batch = torch.export.Dim("batch", min=1, max=1024)
        program = torch.onnx.export(Detect(config), (ids,), dynamo=True, dynamic_shapes=({0: batch},), verbose=False)
        return len(program.model_proto.graph.node)

    assert node_count(["a", "b"]) == node_count(["a", "b", "c", "d", "e", "f"])
