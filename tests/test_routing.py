"""One routing rule, every path (modeling/task_router.py): a text reaches the same expert, and gives the same
vector, through sentence-transformers, `AutoModel`, the exported ONNX graph fed from `tokenizer.json` as a
client feeds it (fp32 and int8) and OpenVINO, on every base (BERT, MPNet, ModernBERT). The expected experts are
written here by hand from the rule (docs/architecture.md, "Routing"), not read from the code under test."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import client_feed, record_experts, save_trained_copy
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

TEXT = "who was isaac newton?"
# (what the caller passes as text, the sentence-transformers call, the expert by the rule); the tiny model's
# tokenizer is uncased, and its pre-tokenizer splits on spaces and punctuation
CASES = [
    ("search_query: " + TEXT, {}, "query"),
    ("Search_Query: " + TEXT, {}, "query"),  # case: the uncased tokenizer lowercases
    ("SEARCH_QUERY:" + TEXT, {}, "query"),  # no space after the colon
    ("   search_query:    " + TEXT, {}, "query"),  # leading and inner spaces
    ("search_document: " + TEXT, {}, "document"),
    ("Clustering:" + TEXT, {}, "clustering"),
    ("classification: " + TEXT, {}, "classification"),
    (TEXT, {}, "classification"),  # no prefix: the default task, the text as it is
    (TEXT, {"prompt": ""}, "classification"),  # an empty prompt is no prompt
    (TEXT, {"prompt_name": "query"}, "query"),
    (TEXT, {"prompt_name": "document"}, "document"),
    ("search_document: " + TEXT, {"prompt_name": "query"}, "query"),  # the prompt comes first
    ("represent this: search_query: " + TEXT, {}, "classification"),  # a prefix routes only at the start
    (TEXT, {"task": "clustering"}, "clustering"),  # the call's task
    ("search_query: " + TEXT, {"task": "document"}, "document"),  # beats the text's prefix
]


# A cased byte-level BPE tokenizer (ModernBERT's) reads a prefix only as it is spelt: another case, or spaces in
# front (which it keeps as tokens), is no prefix, so those rows take the default task
CASED_BPE = {
    "Search_Query: " + TEXT: "classification",
    "SEARCH_QUERY:" + TEXT: "classification",
    "   search_query:    " + TEXT: "classification",
    "Clustering:" + TEXT: "classification",
}


def cases_of(folder) -> list:
    """`CASES` with the experts the folder's tokenizer gives by the rule (its base: `source_model_type`)."""
    base = json.loads((Path(folder) / "config.json").read_text())["source_model_type"]
    if base != "modernbert":  # tiny-minilm's and MPNet's uncased WordPiece tokenizers
        return CASES
    return [(text, call, CASED_BPE.get(text, task) if not call else task) for text, call, task in CASES]


def sent(st, text: str, call: dict) -> str:
    """The text as a client that has no prompt argument sends it: the prompt in front."""
    prompt = call.get("prompt", st.prompts.get(call.get("prompt_name"), ""))
    return prompt + text


@pytest.fixture(scope="module")
def routes_only_dir(dense_path, tmp_path_factory) -> str:
    from conftest import upcycled

    return upcycled(tmp_path_factory, dense_path, "routes-only", prefix_routes_only=True)


@pytest.fixture(
    scope="module",
    params=[
        ("bert", False),
        ("bert", True),
        ("mpnet", False),
        ("modernbert", False),
        ("modernbert", True),
        ("nomic_bert", False),
    ],
    ids=["prefix-fed", "prefix-routes-only", "mpnet", "modernbert", "modernbert-prefix-routes-only", "nomic_bert"],
)
def folder(request, base_folders, tmp_path_factory):
    """A MoTE whose experts differ (a wrong route shows), as upcycled and with `--prefix-routes-only`, of each
    base."""
    base, routes_only = request.param
    source = base_folders(base, prefix_routes_only=True) if routes_only else base_folders(base)
    trained = tmp_path_factory.mktemp("routing") / "trained"
    save_trained_copy(source, trained, seed=11)
    return trained


def st_path(folder, cases):
    """sentence-transformers: each case's `encode` call; the experts as the model reported them."""
    st = SentenceTransformer(str(folder), trust_remote_code=True)
    seen = record_experts(st)
    vectors = [st.encode([text], **call)[0] for text, call, _ in cases]
    return np.stack(vectors), [int(ids[0]) for ids in seen], st


def automodel_path(folder, texts, tasks=None):
    """`AutoModel` on what a client sends, pooled as the folder's modules say (mean over the tokenizer's mask, or
    the first token) and normalised, as the transformers snippet of a model card does."""
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    model = AutoModel.from_pretrained(str(folder), trust_remote_code=True).eval()
    pooling = json.loads((Path(folder) / "1_Pooling" / "config.json").read_text())
    cls = pooling.get("pooling_mode") == "cls" or pooling.get("pooling_mode_cls_token", False)  # 6.x's form, 5.x's
    vectors, experts = [], []
    for index, text in enumerate(texts):
        batch = tokenizer([text], return_tensors="pt", truncation=True)
        with torch.no_grad():
            out = model(**batch, **({"task": tasks[index]} if tasks and tasks[index] else {}))
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled = out.last_hidden_state[:, 0] if cls else (out.last_hidden_state * mask).sum(1) / mask.sum(1)
        vectors.append(torch.nn.functional.normalize(pooled, dim=-1)[0].numpy())
        experts.append(int(out.task_ids[0]))
    return np.stack(vectors), experts


def cosines(a, b):
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


def test_sentence_transformers_and_automodel_route_and_embed_alike(folder):
    cases = cases_of(folder)
    st_vectors, st_experts, st = st_path(folder, cases)
    tasks = st[0].auto_model.config.tasks
    assert [tasks[i] for i in st_experts] == [task for _, _, task in cases]
    texts = [sent(st, text, call) for text, call, _ in cases]
    am_vectors, am_experts = automodel_path(folder, texts, [call.get("task") for _, call, _ in cases])
    assert [tasks[i] for i in am_experts] == [task for _, _, task in cases]
    assert cosines(st_vectors, am_vectors).min() >= 0.9999


def test_a_mixed_batch_routes_each_row_as_alone(folder):
    st = SentenceTransformer(str(folder), trust_remote_code=True)
    plain = [(text, task) for text, call, task in cases_of(folder) if not call]
    together = st.encode([text for text, _ in plain])
    alone = np.stack([st.encode([text])[0] for text, _ in plain])
    assert cosines(together, alone).min() >= 0.9999
    expected = [st[0].auto_model.config.tasks.index(task) for _, task in plain]
    features = st.tokenize([text for text, _ in plain])
    names = ("input_ids", "attention_mask", "token_type_ids", "task_ids")
    inputs = {name: features[name] for name in names if name in features}
    routed = st[0].auto_model(**inputs).task_ids.tolist()
    assert routed == expected


def test_a_prefix_routes_only_folder_reads_the_text_alone(routes_only_dir, mote_dir, dense_path):
    """Untrained, a `--prefix-routes-only` MoTE is the dense model on the text without its prefix (every expert
    is the dense FFN), whichever way the prefix is spelt and whoever calls it; a prefix-fed one reads it."""
    dense = SentenceTransformer(dense_path)
    texts = ["Search_Query: " + TEXT, "search_document:" + TEXT, "  clustering: " + TEXT, TEXT]
    plain = dense.encode([TEXT] * len(texts))
    st = SentenceTransformer(routes_only_dir, trust_remote_code=True)
    assert cosines(st.encode(texts), plain).min() >= 0.9999
    assert cosines(st.encode([TEXT], prompt_name="query"), plain[:1]).min() >= 0.9999
    pooled, _ = automodel_path(routes_only_dir, texts)  # pooled over the tokenizer's mask, prefix included
    assert cosines(pooled, plain).min() >= 0.9999
    fed = SentenceTransformer(mote_dir, trust_remote_code=True).encode(texts[:1])
    assert cosines(fed, dense.encode(texts[:1])).min() >= 0.9999
    assert cosines(fed, plain[:1]).max() < 0.9999  # it does read the prefix


def graph_runs(folder):
    """`(name, run)` of each graph a client may load from an exported folder: onnxruntime fp32 and int8, OpenVINO
    fp32 and its own int8; `run(feed)` gives the outputs by name."""
    import onnxruntime
    import openvino

    def ort(file):
        session = onnxruntime.InferenceSession(str(folder / file), providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        inputs = {i.name for i in session.get_inputs()}
        return lambda feed: dict(
            zip(names, session.run(None, {k: v for k, v in feed.items() if k in inputs}), strict=True)
        )

    def ov(file, config):
        compiled = openvino.Core().compile_model(str(folder / file), "CPU", config)
        inputs = {i.get_any_name() for i in compiled.inputs}
        return lambda feed: {
            o.get_any_name(): v for o, v in compiled({k: v for k, v in feed.items() if k in inputs}).items()
        }

    return [
        ("onnx-fp32", ort("onnx/model.onnx")),
        ("onnx-int8", ort("onnx/model_qint8_avx512_vnni.onnx")),
        ("openvino-fp32", ov("onnx/model.onnx", {"INFERENCE_PRECISION_HINT": "f32"})),
        ("openvino-int8", ov("openvino/openvino_model_qint8_quantized.xml", {})),
    ]


def check_graphs(source, exported):
    st = SentenceTransformer(str(source), trust_remote_code=True)
    tasks = st[0].auto_model.config.tasks
    graph_cases = [case for case in cases_of(source) if "task" not in case[1]]
    texts = [sent(st, text, call) for text, call, _ in graph_cases]
    expected = [tasks.index(task) for _, _, task in graph_cases]
    reference = np.stack([st.encode([text])[0] for text in texts])
    for name, run in graph_runs(exported):
        batches = [(texts, expected), *[([text], [task]) for text, task in zip(texts[:3], expected, strict=False)]]
        for batch, want in batches:  # a mixed batch, and rows alone
            assert run(client_feed(exported, batch))["routed_task_ids"].tolist() == want, name
        out = run(client_feed(exported, texts))
        if name.endswith("fp32"):  # int8 routes alike and is held to its recorded agreement elsewhere
            assert cosines(out["sentence_embedding"], reference).min() >= 0.9999, name


def test_the_exported_graphs_route_and_embed_as_sentence_transformers(trained_mote, mote_onnx):
    check_graphs(trained_mote, mote_onnx)


@pytest.mark.slow
@pytest.mark.parametrize("base", ["mpnet", "modernbert", "nomic_bert"])
def test_the_exported_graphs_of_every_base_route_and_embed_as_sentence_transformers(
    base, base_folders, tmp_path_factory
):
    from conftest import INT8, export_onnx_folder

    trained = tmp_path_factory.mktemp("routing") / f"{base}-trained"
    save_trained_copy(base_folders(base), trained, seed=11)
    check_graphs(trained, export_onnx_folder(tmp_path_factory, trained, **INT8))


@pytest.mark.slow
def test_a_prefix_routes_only_export_routes_and_embeds_as_sentence_transformers(routes_only_dir, tmp_path_factory):
    from conftest import INT8, export_onnx_folder

    trained = tmp_path_factory.mktemp("routing") / "routes-only-trained"
    save_trained_copy(routes_only_dir, trained, seed=13)
    check_graphs(trained, export_onnx_folder(tmp_path_factory, trained, **INT8))


def test_the_graph_reads_every_prefix_in_the_same_ops():
    """Prefix matching in a traced graph is a few ops whatever the number of tasks: per task, onnxruntime would
    run its own compare, reduce and select on every request."""
    from conftest import tiny_mote_config

    from moe_embed.modeling.task_router import TaskRouter

    class Match(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.router = TaskRouter(config)

        def forward(self, input_ids):
            return self.router.match(input_ids)

    def node_count(tasks):
        prefixes = {task: [101, 2000 + index, 1024] for index, task in enumerate(tasks)}
        config = tiny_mote_config(tasks=tasks, task_prefix_ids=prefixes, task_prefixes=None, default_task=None)
        ids = torch.tensor([[101, 2001, 1024, 7], [101, 5, 6, 7]])
        batch = torch.export.Dim("batch", min=1, max=1024)
        program = torch.onnx.export(Match(config), (ids,), dynamo=True, dynamic_shapes=({0: batch},), verbose=False)
        return len(program.model_proto.graph.node)

    assert node_count(["a", "b"]) == node_count(["a", "b", "c", "d", "e", "f"])


@pytest.mark.parametrize("family", ["moe_dir", "comoe_dir"])
def test_a_token_routed_model_refuses_a_task_it_cannot_route(family, request):
    """A token MoE (and CoMoE) has no task experts: `task="clustering"` is refused with a line saying what to do,
    never ignored; sentence-transformers' own `encode_query` / `encode_document` still work (their prompts)."""
    st = SentenceTransformer(request.getfixturevalue(family), trust_remote_code=True)
    with pytest.raises(ValueError, match=r"task='clustering': .* has no task experts.*prompt_name"):
        st.encode([TEXT], task="clustering")
    query = st.encode_query([TEXT])
    assert cosines(query, st.encode([st.prompts.get("query", "") + TEXT])).min() >= 0.9999
    assert cosines(query, st.encode([TEXT], task="Query", prompt_name="query")).min() >= 0.9999  # any case


def test_mteb_finds_a_prompt_name_of_its_own_for_every_task_of_a_mote_folder(mote_dir):
    """mteb checks a model's prompt names against its task types, prompt types and task names, and leaves out
    (with a warning) any other: a MoTE folder's prompts name every task both by its own name (what
    `prompt_name=` users write) and in mteb's spelling, and mteb leaves out only the former, so every task type it
    evaluates still finds its prompt."""
    from mteb.models.abs_encoder import AbsEncoder

    from moe_embed.modeling.defaults import prompt_key

    st = SentenceTransformer(mote_dir, trust_remote_code=True)
    with pytest.warns(UserWarning, match="Task name (classification|clustering) is not valid"):
        valid, invalid = AbsEncoder.validate_task_to_prompt_name(st.prompts, raise_for_invalid_keys=False)
    tasks = st[0].auto_model.config.tasks
    left_out = set(st.prompts) - set(valid)
    assert left_out == {task for task in tasks if prompt_key(task) != task} == {"classification", "clustering"}
    assert len(invalid) == 2 and all(prompt_key(task) in valid for task in tasks)
    config = st[0].auto_model.config
    assert set(config.task_prefixes.values()) <= set(st.prompts.values())
    for name, prefix in st.prompts.items():  # each name reaches the expert of the prefix it holds
        expected = config.tasks.index(next(t for t, p in config.task_prefixes.items() if p == prefix))
        ids = st.tokenize([prefix + TEXT])["input_ids"]
        assert int(st[0].auto_model(input_ids=ids).task_ids[0]) == expected, name


def test_an_old_sentence_transformers_gets_one_line_naming_the_version(monkeypatch):
    """sentence-transformers older than the folder supports (Infinity pins 3.4.1) ends in one line naming the
    version, not an AttributeError from inside it."""
    import importlib

    import sentence_transformers

    import moe_embed.modeling.st_compat

    monkeypatch.setattr(sentence_transformers, "__version__", "3.4.1")
    with pytest.raises(ImportError, match=r"needs sentence-transformers>=5\.1, found 3\.4\.1: pip install -U"):
        importlib.reload(moe_embed.modeling.st_compat)
    monkeypatch.undo()
    importlib.reload(moe_embed.modeling.st_compat)


def test_a_task_name_finds_its_prompt_where_a_prompt_name_is_asked_for(mote_dir):
    """`moe-embed embed --task classification` and the inter-task analysis name MoTE tasks; the folder's prompt
    names are mteb's (`Classification`): the task's name finds its prompt, a prompt name itself still works."""
    from moe_embed.training.embedders import prompt_name

    prompts = SentenceTransformer(mote_dir, trust_remote_code=True).prompts
    assert [prompts[prompt_name(prompts, task)] for task in ("query", "document", "classification", "clustering")] == [
        "search_query: ",
        "search_document: ",
        "classification: ",
        "clustering: ",
    ]
    assert prompt_name(prompts, "STS") == "STS" and prompt_name(prompts, "legal") is None  # unknown: none
