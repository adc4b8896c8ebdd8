"""The Sentence-Transformers module: prompts, encode_query/encode_document and task= pick experts."""

import pytest
import torch
from conftest import TEXTS
from sentence_transformers import SentenceTransformer

PROMPTS = {
    "query": "search_query: ",
    "document": "search_document: ",
    # mteb's task types that it encodes with no prompt type, each to the expert the MoTE paper maps it to
    "STS": "classification: ",
    "PairClassification": "classification: ",
    "Classification": "classification: ",
    "MultilabelClassification": "classification: ",
    "Summarization": "classification: ",
    "Clustering": "clustering: ",
    # every task's own name, so that `prompt_name=` takes the task's name as `task=` does
    "classification": "classification: ",
    "clustering": "clustering: ",
}


@pytest.fixture(scope="module")
def st_mote(mote_dir):
    return SentenceTransformer(mote_dir, trust_remote_code=True)


@pytest.fixture(scope="module")
def st_dense(dense_path):
    return SentenceTransformer(dense_path)


def test_saved_prompts(st_mote):
    assert st_mote.prompts == PROMPTS
    assert "task" in st_mote.get_model_kwargs()


@pytest.mark.parametrize("prompt_name", sorted(PROMPTS))
def test_prompt_embeddings_equal_dense_model(st_mote, st_dense, prompt_name):
    got = st_mote.encode(TEXTS, prompt_name=prompt_name, convert_to_tensor=True)
    expected = st_dense.encode([PROMPTS[prompt_name] + t for t in TEXTS], convert_to_tensor=True)
    assert (got - expected).abs().max() <= 1e-5


def test_encode_query_document_and_task_kwarg_equal_dense(st_mote, st_dense):
    def dense(prefix):
        return st_dense.encode([prefix + t for t in TEXTS], convert_to_tensor=True)

    assert (st_mote.encode_query(TEXTS, convert_to_tensor=True) - dense("search_query: ")).abs().max() <= 1e-5
    assert (st_mote.encode_document(TEXTS, convert_to_tensor=True) - dense("search_document: ")).abs().max() <= 1e-5
    # task= picks the expert and adds nothing (as `AutoModel(task=)` and a graph's `task_ids`); the prompt is read
    assert (st_mote.encode(TEXTS, task="clustering", convert_to_tensor=True) - dense("")).abs().max() <= 1e-5
    prompted = st_mote.encode(TEXTS, prompt_name="Clustering", convert_to_tensor=True)
    assert (prompted - dense("clustering: ")).abs().max() <= 1e-5
    # raw text that already carries a prefix is routed by it
    raw = st_mote.encode(["classification: " + t for t in TEXTS], convert_to_tensor=True)
    assert (raw - dense("classification: ")).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def st_mote_specialised(mote_dir):
    """MoTE whose experts differ, so that the routing of each call is observable."""
    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    auto_model = model[0].auto_model
    with torch.no_grad():
        for layer in auto_model.config.expert_layers:
            for index, expert in enumerate(auto_model.encoder.layer[layer].experts.values()):
                expert.output.LayerNorm.bias.add_(0.05 * (index + 1))
    return model


def _routed_by(model, texts, prompt_name, **kwargs):
    """Which expert produced the embeddings: compare with each task forced on the same input text."""
    got = model.encode(texts, convert_to_tensor=True, prompt_name=prompt_name, **kwargs)
    prompt = model.prompts[prompt_name]
    matches = []
    for task in model[0].auto_model.config.tasks:
        forced = model.encode(texts, convert_to_tensor=True, task=task, prompt=prompt)
        if torch.allclose(got, forced, atol=1e-6):
            matches.append(task)
    return matches


def test_each_entry_point_routes_to_its_expert(st_mote_specialised):
    model = st_mote_specialised
    assert _routed_by(model, TEXTS, "Clustering") == ["clustering"]
    assert _routed_by(model, TEXTS, "document") == ["document"]
    assert _routed_by(model, TEXTS, "STS") == ["classification"]  # mteb's task types: their experts
    # an explicit task beats the prompt's prefix
    assert _routed_by(model, TEXTS, "query", task="classification") == ["classification"]
    query = model.encode_query(TEXTS, convert_to_tensor=True)
    assert torch.allclose(query, model.encode(TEXTS, prompt_name="query", task="query", convert_to_tensor=True))
    document = model.encode_document(TEXTS, convert_to_tensor=True)
    assert torch.allclose(
        document, model.encode(TEXTS, prompt_name="document", task="document", convert_to_tensor=True)
    )
    assert not torch.allclose(query, document, atol=1e-3)


def test_task_and_prompt_names_in_either_spelling(st_mote_specialised):
    """A task's own name (`classification`) and mteb's spelling of it (`Classification`) are both prompt names
    and both task names: a user need not know which spelling a call wants."""
    model = st_mote_specialised
    for task, mteb_name in (("classification", "Classification"), ("clustering", "Clustering"), ("query", "QUERY")):
        if mteb_name in model.prompts:
            assert _routed_by(model, TEXTS, task) == _routed_by(model, TEXTS, mteb_name) == [task]
        by_name = model.encode(TEXTS, task=task, convert_to_tensor=True)
        assert torch.equal(model.encode(TEXTS, task=mteb_name, convert_to_tensor=True), by_name)


def test_task_without_prefix_option(mote_dir):
    """`prefix_routes_only`: `task=`, a prompt that is a task prefix and a prefix at the start of a text all pick
    the same expert, and the encoder reads the plain text in every case."""
    from conftest import randomize_experts

    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    randomize_experts(model[0].auto_model)
    model[0].auto_model.config.prefix_routes_only = True
    with_task = model.encode(TEXTS, task="query", convert_to_tensor=True)
    fed = SentenceTransformer(mote_dir, trust_remote_code=True)
    fed[0].auto_model.load_state_dict(model[0].auto_model.state_dict())
    reference = fed.encode(TEXTS, task="query", convert_to_tensor=True)  # the query expert, no prefix
    assert torch.allclose(with_task, reference, atol=1e-6)
    assert torch.allclose(with_task, model.encode(TEXTS, prompt_name="query", convert_to_tensor=True), atol=1e-6)
    assert torch.allclose(with_task, model.encode_query(TEXTS, convert_to_tensor=True), atol=1e-6)
    raw = model.encode(["search_query: " + t for t in TEXTS], prompt="", convert_to_tensor=True)
    assert torch.allclose(with_task, raw, atol=1e-6)
    # a mixed batch: each row's own prefix picks its expert
    mixed = model.encode(["search_query: " + TEXTS[0], "clustering: " + TEXTS[1]], convert_to_tensor=True)
    assert torch.allclose(mixed[0], with_task[0], atol=1e-6)
    clustering = model.encode(TEXTS[1:2], task="clustering", convert_to_tensor=True)[0]
    assert torch.allclose(mixed[1], clustering, atol=1e-6)
    assert not torch.allclose(with_task, model.encode(TEXTS, task="document", convert_to_tensor=True), atol=1e-3)


def test_prefix_routes_only_folder_embeds_plain_text_as_the_dense_model(dense_path, tmp_path, st_dense):
    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    folder = upcycle(upcycle_options(base=dense_path, output=tmp_path / "route-only", prefix_routes_only=True))
    model = SentenceTransformer(str(folder), trust_remote_code=True)
    assert model[0].auto_model.config.prefix_routes_only is True
    reference = st_dense.encode(TEXTS, convert_to_tensor=True)
    for kwargs in ({}, {"prompt_name": "query"}, {"prompt_name": "document"}, {"task": "clustering"}):
        assert torch.allclose(model.encode(TEXTS, convert_to_tensor=True, **kwargs), reference, atol=1e-5), kwargs


def test_unknown_task_and_missing_task_errors(st_mote):
    with pytest.raises(ValueError, match="`task` takes one task name per call"):
        st_mote.encode(TEXTS, task=["query", "document", "query"])
    with pytest.raises(ValueError, match=r"Unknown task 'legal'.*Valid tasks"):
        st_mote.encode(TEXTS, task="legal")


def test_plain_encode_uses_the_default_task(st_mote_specialised):
    """Generic callers (mteb, vector databases) call `encode(texts)` with no prompt: the text, as it is, reaches
    the default task's expert, as it does through `AutoModel` or the exported graph; `prompt=""` means the same.
    The folder sets no `default_prompt_name`, so loading it logs no default-prompt warning."""
    model = st_mote_specialised
    assert model.default_prompt_name is None
    config = model[0].auto_model.config
    assert config.default_task == "classification"
    plain = model.encode(TEXTS, convert_to_tensor=True)
    assert torch.allclose(plain, model.encode(TEXTS, prompt="", convert_to_tensor=True), atol=1e-6)
    assert torch.allclose(plain, model.encode(TEXTS, task="classification", convert_to_tensor=True), atol=1e-6)
    features = model.tokenize(TEXTS)
    assert features["input_ids"].tolist() == model.tokenizer(TEXTS, padding=True)["input_ids"]  # nothing added
    # the prompt is read: not the plain text's vector
    assert not torch.allclose(plain, model.encode(TEXTS, prompt_name="Classification", convert_to_tensor=True), 1e-3)
    clustering = model.encode(TEXTS, task="clustering", convert_to_tensor=True)
    assert not torch.allclose(plain, clustering, atol=1e-3)
    # a text's own prefix routes it
    by_prefix = model.encode(["clustering: " + t for t in TEXTS], convert_to_tensor=True)
    prompted = model.encode(TEXTS, prompt_name="Clustering", convert_to_tensor=True)
    assert torch.allclose(by_prefix, prompted, atol=1e-6)
