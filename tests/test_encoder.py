"""The shared encoder: the padding mask in every attention backend's format, named outputs, configs left alone."""

import copy

import pytest
import torch
from conftest import randomize_experts, tiny_moe_config, tiny_mote_config

from moe_embed.modeling.modeling_encoder import EncoderBackboneOutput
from moe_embed.modeling.modeling_moe import MoeBertModel
from moe_embed.modeling.modeling_mote import MoteBertModel

TEXTS = ["search_query: a b c d e f g", "clustering: x", "classification: one two"]


def _model(family):
    if family == "mote":
        model = MoteBertModel(tiny_mote_config()).eval()
        randomize_experts(model)
        return model
    torch.manual_seed(0)
    return MoeBertModel(tiny_moe_config(vocab_size=30522)).eval()


@pytest.mark.parametrize("family", ["mote", "moe"])
def test_eager_and_sdpa_agree_on_padded_batches_and_rows_do_not_see_padding(family, tokenizer):
    model = _model(family)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].bool()
    assert not mask.all()  # the batch is padded
    with torch.no_grad():
        model.config._attn_implementation = "sdpa"
        sdpa = model(**batch).last_hidden_state
        model.config._attn_implementation = "eager"
        eager = model(**batch, output_attentions=True)
        alone = [model(**tokenizer([text], return_tensors="pt")).last_hidden_state[0] for text in TEXTS]
    assert (sdpa - eager.last_hidden_state)[mask].abs().max() <= 1e-5
    for layer_weights in eager.attentions:  # padded keys get no attention in any layer
        assert layer_weights.masked_select(~mask[:, None, None, :]).abs().max() == 0
    for row, expected in enumerate(alone):  # padding changes nothing for the real tokens
        assert (sdpa[row, : expected.shape[0]] - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["mote", "moe"])
def test_backbone_output_is_named(family, tokenizer):
    model = _model(family)
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model.forward_backbone(**batch, output_hidden_states=True, routing=_routing(model, batch))
    assert isinstance(out, EncoderBackboneOutput)
    assert out.last_hidden_state.shape == (*batch["input_ids"].shape, model.config.hidden_size)
    assert out.pooler_output.shape == (len(TEXTS), model.config.hidden_size)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1
    expected_aux = len(model.config.moe_layers) if family == "moe" else 0
    assert len(out.layer_aux) == expected_aux


def _routing(model, batch):
    if isinstance(model, MoteBertModel):
        from moe_embed.modeling.modeling_mote import MoteRouting

        return MoteRouting(((0, 0, batch["input_ids"].shape[0]),))
    from moe_embed.modeling.modeling_moe import MoeRouting

    return MoeRouting(batch["attention_mask"].reshape(-1).nonzero().squeeze(-1))


def test_mote_model_leaves_the_callers_config_unchanged():
    config = tiny_mote_config(active_tasks=["passage", "query"])
    before = copy.deepcopy(config.to_dict())
    model = MoteBertModel(config, active_tasks=["clustering"])
    assert config.to_dict() == before
    assert model.config.active_tasks == ["clustering"]
    assert MoteBertModel(config).config.active_tasks == ["query", "document"]  # aliases resolved, in task order
    assert config.active_tasks == ["passage", "query"]
