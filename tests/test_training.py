"""SentenceTransformerTrainer routes each dataset to its expert (by prompt or by router_mapping)."""

import importlib.util

import pytest
import torch
from conftest import REPO
from datasets import DatasetDict
from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer, SentenceTransformerTrainingArguments
from sentence_transformers.losses import MultipleNegativesRankingLoss

from moe_embed.training.sampler import TaskAwareBatchSampler

pytestmark = pytest.mark.slow  # every test here trains or runs a Hub upload in fresh processes


def _datasets():
    """The two-task data of examples/finetune_two_tasks.py (retrieval pairs and clustering pairs)."""
    spec = importlib.util.spec_from_file_location("finetune_example", REPO / "examples" / "finetune_two_tasks.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return DatasetDict(
        {"retrieval": example.to_dataset(example.RETRIEVAL), "clusters": example.to_dataset(example.CLUSTERING)}
    )


def _expert_params(model, task):
    auto = model[0].auto_model
    index = auto.config.tasks.index(task)
    return {
        f"{layer}.{name}": p.detach().clone()
        for layer in auto.config.expert_layers
        for name, p in auto.encoder.layer[layer].experts[str(index)].named_parameters()
    }


@pytest.mark.parametrize("routing", ["prompts", "router_mapping"])
def test_trainer_updates_only_experts_of_seen_tasks(mote_dir, tmp_path, routing):
    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    tasks = model[0].auto_model.config.tasks
    before = {task: _expert_params(model, task) for task in tasks}
    shared_before = model[0].auto_model.encoder.layer[0].intermediate.dense.weight.detach().clone()

    if routing == "prompts":
        extra = {
            "prompts": {
                "retrieval": {"anchor": "search_query: ", "positive": "search_document: "},
                "clusters": "clustering: ",
            }
        }
    else:  # tasks named per column; the module prepends each task's prefix
        extra = {
            "router_mapping": {
                "retrieval": {"anchor": "query", "positive": "document"},
                "clusters": {"anchor": "clustering", "positive": "clustering"},
            }
        }
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=4,
        learning_rate=1e-3,
        weight_decay=0.0,
        warmup_steps=0,
        logging_steps=100,
        save_strategy="no",
        report_to="none",
        seed=0,
        dataloader_drop_last=True,
        multi_dataset_batch_sampler=TaskAwareBatchSampler,
        **extra,
    )
    trainer = SentenceTransformerTrainer(
        model=model, args=args, train_dataset=_datasets(), loss=MultipleNegativesRankingLoss(model)
    )
    trainer.train()

    for task in tasks:
        after = _expert_params(model, task)
        changed = any(not torch.equal(after[name], before[task][name]) for name in after)
        assert changed == (task in ("query", "document", "clustering")), task
    assert not torch.equal(model[0].auto_model.encoder.layer[0].intermediate.dense.weight, shared_before)


def test_with_aux_loss_is_added_and_trains_the_router(moe_dir, tmp_path):
    from moe_embed.training.losses import WithAuxLoss

    model = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    auto = model[0].auto_model
    base = MultipleNegativesRankingLoss(model)
    loss = WithAuxLoss(base)
    features = [
        model.preprocess(["search_query: " + a for a in ("cats", "dogs")]),
        model.preprocess(["search_document: " + p for p in ("a cat", "a dog")]),
    ]
    labels = torch.zeros(2)
    total = loss(features, labels)
    contrastive = base([{k: v for k, v in f.items() if k != "aux_loss"} for f in features], labels)
    with torch.no_grad():
        aux = torch.stack(
            [auto(**{k: f[k] for k in ("input_ids", "attention_mask", "token_type_ids")}).aux_loss for f in features]
        ).mean()
    assert torch.allclose(total, contrastive + aux, atol=1e-5)
    total.backward()
    router = auto.encoder.layer[auto.config.moe_layers[0]].mlp.router.weight
    assert router.grad is not None and router.grad.abs().sum() > 0

    # and in a trainer run the router moves
    before = router.detach().clone()
    args = SentenceTransformerTrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=2,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        seed=0,
        prompts={"retrieval": "search_query: ", "clusters": "clustering: "},
    )
    SentenceTransformerTrainer(model=model, args=args, train_dataset=_datasets(), loss=loss).train()
    assert not torch.equal(router.detach(), before)


def test_with_aux_loss_refuses_a_model_without_aux_loss(mote_dir):
    from moe_embed.training.losses import WithAuxLoss

    model = SentenceTransformer(mote_dir, trust_remote_code=True)
    loss = WithAuxLoss(MultipleNegativesRankingLoss(model))
    features = [model.preprocess(["search_query: cats"]), model.preprocess(["search_document: a cat"])]
    with pytest.raises(ValueError, match=r"found `aux_loss` in 0 of 2 inputs.*st_moe.MoeTransformer"):
        loss(features, torch.zeros(1))


def test_with_aux_loss_around_matryoshka_adds_aux_once(moe_dir):
    from sentence_transformers.losses import MatryoshkaLoss

    from moe_embed.training.losses import WithAuxLoss

    model = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    dims = [model.get_embedding_dimension(), 16]
    matryoshka = MatryoshkaLoss(model, MultipleNegativesRankingLoss(model), matryoshka_dims=dims)
    loss = WithAuxLoss(matryoshka)

    def features():
        return [
            model.preprocess(["search_query: cats", "search_query: dogs"]),
            model.preprocess(["search_document: a cat", "search_document: a dog"]),
        ]

    model.eval()  # no dropout: the three evaluations below see the same function
    labels = torch.zeros(2)
    total = loss(features(), labels)
    plain = matryoshka(features(), labels)
    inputs = features()
    aux = torch.stack([model(f)["aux_loss"] for f in inputs]).mean()
    assert torch.allclose(total, plain + aux, atol=1e-5)


def test_with_aux_loss_with_hard_negatives(moe_dir):
    """(anchor, positive, negative) columns: the loss may merge columns; the aux loss still arrives."""
    from moe_embed.training.losses import WithAuxLoss

    model = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    model.eval()
    loss = WithAuxLoss(MultipleNegativesRankingLoss(model))
    features = [
        model.preprocess(["search_query: cats", "search_query: dogs"]),
        model.preprocess(["search_document: a cat", "search_document: a dog"]),
        model.preprocess(["search_document: a car", "search_document: a tree"]),
    ]
    total = loss(features, torch.zeros(2))
    aux = torch.stack([f["aux_loss"] for f in features]).mean()
    plain = MultipleNegativesRankingLoss(model)(
        [{k: v for k, v in f.items() if k != "aux_loss"} for f in features], None
    )
    assert torch.allclose(total, plain + aux, atol=1e-5)
