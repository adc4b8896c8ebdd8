"""Token-routed sparse MoE encoder: equivalence after upcycling, experts implementations, losses."""

import json
from pathlib import Path

import pytest
import torch
from conftest import TEXTS, randomize_experts, run_isolated, tiny_moe_config
from sentence_transformers import SentenceTransformer

from moe_embed.modeling.modeling_moe import MoeBertModel, MoeBertSparseBlock
from moe_embed.modeling.router_losses import load_balancing_loss, router_z_loss

IMPLEMENTATIONS = ["eager", "batched_mm", "grouped_mm"]


@pytest.mark.parametrize("router", ["zeros", "random"])
def test_upcycled_equals_dense_whatever_the_router(moe_dir, dense_model, tokenizer, router):
    model = MoeBertModel.from_pretrained(moe_dir).eval()
    layers = model.config.num_hidden_layers
    assert model.config.norm_topk_prob and model.config.moe_layers == list(range(1, layers, 2))
    torch.manual_seed(1)
    with torch.no_grad():
        for layer in model.config.moe_layers:
            weight = model.encoder.layer[layer].mlp.router.weight
            weight.copy_(torch.zeros_like(weight) if router == "zeros" else torch.randn_like(weight))
    batch = tokenizer(["search_query: " + t for t in TEXTS], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_router_logits=True)
        expected = dense_model(**batch)
    mask = batch["attention_mask"].bool()
    assert (out.last_hidden_state - expected.last_hidden_state)[mask].abs().max() <= 1e-5
    assert (out.pooler_output - expected.pooler_output).abs().max() <= 1e-5
    # router logits cover the non-padding tokens only
    assert [tuple(logits.shape) for logits in out.router_logits] == [(int(mask.sum()), 8)] * len(range(1, layers, 2))


def _random_batch():
    torch.manual_seed(0)
    ids = torch.randint(5, 1000, (4, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[3, 2:] = 0
    return ids, mask


@pytest.mark.parametrize("norm_topk_prob", [False, True])
def test_experts_implementations_agree_with_gradients(norm_topk_prob):
    torch.manual_seed(0)
    model = MoeBertModel(tiny_moe_config(norm_topk_prob=norm_topk_prob)).train()
    ids, mask = _random_batch()
    projection = torch.randn(4, 9, 32)
    results = {}
    for implementation in IMPLEMENTATIONS:
        model.set_experts_implementation(implementation)
        assert model.config._experts_implementation == implementation
        model.zero_grad()
        out = model(input_ids=ids, attention_mask=mask)
        ((out.last_hidden_state * projection * mask[..., None]).sum() + out.aux_loss).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[implementation] = (out.last_hidden_state.detach(), out.aux_loss.detach(), grads)
    reference_out, reference_aux, reference_grads = results["eager"]
    keep = mask.bool()
    for implementation in IMPLEMENTATIONS[1:]:
        out, aux, grads = results[implementation]
        assert (out - reference_out)[keep].abs().max() <= 1e-5, implementation
        assert torch.allclose(aux, reference_aux)
        assert grads.keys() == reference_grads.keys()
        for name in grads:
            assert torch.allclose(grads[name], reference_grads[name], atol=1e-5), (implementation, name)
    assert any("mlp.experts.up_proj" in n for n in reference_grads) and any("router" in n for n in reference_grads)


def test_padding_is_not_routed():
    model = MoeBertModel(tiny_moe_config()).eval()
    randomize_experts(model)
    ids, mask = _random_batch()
    with torch.no_grad():
        padded = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
        rows = [model(input_ids=ids[i : i + 1, : int(mask[i].sum())], output_router_logits=True) for i in range(4)]
    for i, row in enumerate(rows):
        n = int(mask[i].sum())
        assert (padded.last_hidden_state[i, :n] - row.last_hidden_state[0]).abs().max() <= 1e-5
    # the router saw exactly the non-padding tokens, in order
    for layer, logits in enumerate(padded.router_logits):
        assert torch.allclose(logits, torch.cat([r.router_logits[layer] for r in rows]), atol=1e-5)
    # and the padding tokens do not move the load-balancing loss
    expected = torch.stack([load_balancing_loss(logits, 2) for logits in padded.router_logits]).mean()
    assert torch.allclose(padded.aux_loss, expected)


def test_load_balancing_loss_hand_computed():
    # 4 tokens, 3 experts, top-1. Probabilities: token i puts 0.5 on its expert, 0.25 on the others.
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5]]))
    # f = [2/4, 1/4, 1/4]; P = mean rows = [0.375, 0.3125, 0.3125]
    # loss = 3 * (0.5*0.375 + 0.25*0.3125 + 0.25*0.3125) = 3 * 0.34375 = 1.03125
    assert torch.isclose(load_balancing_loss(logits, 1), torch.tensor(1.03125))
    # top-2 with distinct probabilities
    logits2 = torch.log(torch.tensor([[0.6, 0.3, 0.1], [0.1, 0.6, 0.3]]))
    # slots: {0,1} and {1,2}: f = [1/4, 2/4, 1/4]; P = [0.35, 0.45, 0.2]
    assert torch.isclose(load_balancing_loss(logits2, 2), torch.tensor(3 * (0.25 * 0.35 + 0.5 * 0.45 + 0.25 * 0.2)))
    uniform = torch.zeros(10, 4)
    assert torch.isclose(load_balancing_loss(uniform, 1), torch.tensor(1.0))
    assert torch.isclose(router_z_loss(torch.zeros(3, 4)), torch.log(torch.tensor(4.0)) ** 2)


def test_aux_loss_uses_config_coefficients():
    torch.manual_seed(0)
    ids, mask = _random_batch()
    base = MoeBertModel(tiny_moe_config(router_aux_loss_coef=1.0)).eval()
    with torch.no_grad():
        out = base(input_ids=ids, attention_mask=mask, output_router_logits=True)
        balance = torch.stack([load_balancing_loss(logits, 2) for logits in out.router_logits]).mean()
        z = torch.stack([router_z_loss(logits) for logits in out.router_logits]).mean()
        base.config.router_aux_loss_coef, base.config.router_z_loss_coef = 0.5, 0.1
        weighted = base(input_ids=ids, attention_mask=mask).aux_loss
    assert torch.isclose(out.aux_loss, balance)
    assert torch.isclose(weighted, 0.5 * balance + 0.1 * z)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_experts_no_token_chose_get_zero_gradient(implementation):
    torch.manual_seed(0)
    model = MoeBertModel(tiny_moe_config(num_hidden_layers=2, moe_layers=[1])).train()
    model.set_experts_implementation(implementation)
    block: MoeBertSparseBlock = model.encoder.layer[1].mlp
    # positive inputs and large negative router rows for experts 1 and 3: every token picks 0 and 2
    with torch.no_grad():
        block.router.weight.copy_(torch.tensor([[0.0] * 32, [-1e3] * 32, [0.0] * 32, [-1e3] * 32]))
    hidden = torch.randn(6, 32).abs() + 0.1
    out, logits = block(hidden)
    assert set(torch.topk(logits, 2).indices.flatten().tolist()) == {0, 2}
    (out * torch.randn_like(out)).sum().backward()
    experts = block.experts
    for grad in (experts.up_proj.grad, experts.down_proj.grad, experts.up_proj_bias.grad, experts.down_proj_bias.grad):
        assert grad[[1, 3]].abs().max() == 0
        assert grad[[0, 2]].abs().max() > 0


def test_bad_configs_fail_at_config_time():
    with pytest.raises(ValueError, match=r"num_experts_per_tok` \(5\) must lie in 1..num_local_experts \(4\)"):
        tiny_moe_config(num_experts_per_tok=5)
    with pytest.raises(ValueError, match="at least one layer"):
        tiny_moe_config(moe_layers=[])
    with pytest.raises(ValueError, match=r"moe_layers` holds layer indices \[7\] out of range"):
        tiny_moe_config(moe_layers=[1, 7])
    with pytest.raises(ValueError, match="router_jitter_noise"):
        tiny_moe_config(router_jitter_noise=1.5)
    assert tiny_moe_config().moe_layers == [1, 3]
    assert tiny_moe_config(moe_layers="all").moe_layers == [0, 1, 2, 3]


def test_router_jitter_only_in_training():
    torch.manual_seed(0)
    model = MoeBertModel(tiny_moe_config(router_jitter_noise=0.5))
    ids, mask = _random_batch()
    model.eval()
    with torch.no_grad():
        a = model(input_ids=ids, attention_mask=mask, output_router_logits=True).router_logits[0]
        b = model(input_ids=ids, attention_mask=mask, output_router_logits=True).router_logits[0]
        model.train()
        c = model(input_ids=ids, attention_mask=mask, output_router_logits=True).router_logits[0]
    assert torch.equal(a, b) and not torch.allclose(a, c)


LOAD_AND_ENCODE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(folder, trust_remote_code=True, experts_implementation="eager").eval()
assert model.__class__.__module__.startswith("transformers_modules"), model.__class__.__module__
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
batch = tokenizer(texts, padding=True, return_tensors="pt")
with torch.no_grad():
    out = model(**batch)
st = SentenceTransformer(folder, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
print(json.dumps({"auto": out.last_hidden_state.tolist(), "aux": out.aux_loss.item(),
                  "st": {name: st.encode(texts, prompt_name=name).tolist() for name in st.prompts}}))
"""


@pytest.mark.slow
def test_round_trip_through_a_fresh_process(moe_dir, tmp_path):
    st = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    randomize_experts(st[0].auto_model, seed=5)
    saved = tmp_path / "saved"
    st.save(str(saved))
    assert {p.name for p in saved.iterdir() if p.suffix == ".py"} == {"st_moe.py", "modeling_moe.py"}
    out = json.loads(run_isolated(LOAD_AND_ENCODE, str(saved), json.dumps(TEXTS)).splitlines()[-1])
    model = st[0].auto_model.eval()
    batch = st[0].tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model(**batch)
    assert torch.equal(torch.tensor(out["auto"]), expected.last_hidden_state)
    assert out["aux"] == pytest.approx(expected.aux_loss.item(), abs=1e-6)
    for name, values in out["st"].items():
        assert torch.equal(torch.tensor(values), st.encode(TEXTS, prompt_name=name, convert_to_tensor=True)), name


def test_sentence_transformers_prompts_and_truncate_dim(moe_dir, dense_path):
    st = SentenceTransformer(moe_dir, trust_remote_code=True)
    assert {"query", "document", "Classification", "STS", "Clustering"} <= set(st.prompts)
    dense = SentenceTransformer(dense_path)
    got = st.encode_query(TEXTS, convert_to_tensor=True)
    assert (got - dense.encode(["search_query: " + t for t in TEXTS], convert_to_tensor=True)).abs().max() <= 1e-5
    small = SentenceTransformer(moe_dir, trust_remote_code=True, truncate_dim=16)
    truncated = small.encode_document(TEXTS, convert_to_tensor=True)
    full = st.encode_document(TEXTS, convert_to_tensor=True)
    assert truncated.shape == (len(TEXTS), 16) and full.shape[1] > 16
    assert torch.allclose(truncated, full[:, :16], atol=1e-6)


def test_router_is_fp32_under_autocast_and_all_padding_gives_zero_aux_loss():
    model = MoeBertModel(tiny_moe_config()).eval()
    ids, mask = _random_batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    assert all(logits.dtype == torch.float32 for logits in out.router_logits)
    with torch.no_grad():
        empty = model(input_ids=ids, attention_mask=torch.zeros_like(mask))
    assert empty.aux_loss.item() == 0.0


def test_unnamed_experts_implementation_follows_the_device(monkeypatch):
    """No implementation named: each call runs the fastest measured for its inputs' device, chosen where the
    experts are called and written nowhere (the config keeps `None` through a forward); the model names the one
    for its device; a named one is never replaced."""
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS, ExpertsInterface

    from moe_embed.modeling import modeling_moe

    assert modeling_moe.fastest_experts(torch.device("cuda")) == modeling_moe.DEFAULT_EXPERTS != "eager"
    assert modeling_moe.fastest_experts(torch.device("cpu")) == "eager"
    torch.manual_seed(0)
    model = MoeBertModel(tiny_moe_config()).eval()
    ids, mask = _random_batch()
    with torch.no_grad():
        eager = model(input_ids=ids, attention_mask=mask).last_hidden_state
    ran = []

    def recording(experts, hidden_states, *args):  # stands for the fastest on this device: batched_mm's result
        ran.append(hidden_states.device.type)
        return ALL_EXPERTS_FUNCTIONS["batched_mm"](experts, hidden_states, *args)

    monkeypatch.setitem(ExpertsInterface._global_mapping, "recording", recording)
    monkeypatch.setitem(modeling_moe.FASTEST_EXPERTS, "cpu", "recording")
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    assert ran == ["cpu"] * len(model.config.moe_layers) and torch.allclose(out, eager, atol=1e-5)
    assert model.config._experts_implementation is None
    assert model.get_experts_implementation()[""] == "recording"
    named = MoeBertModel(tiny_moe_config(experts_implementation="grouped_mm")).eval()
    ran.clear()
    with torch.no_grad():
        named(input_ids=ids, attention_mask=mask)
    assert named.get_experts_implementation()[""] == "grouped_mm" and not ran
    named.set_experts_implementation("batched_mm")
    assert named.get_experts_implementation()[""] == "batched_mm"


def test_unnamed_experts_implementation_after_loading(moe_dir):
    model = MoeBertModel.from_pretrained(moe_dir).eval()
    assert model.get_experts_implementation()[""] == "eager"  # this CPU's fastest, before any forward
    assert "experts_implementation" not in json.loads((Path(moe_dir) / "config.json").read_text())
    chosen = MoeBertModel.from_pretrained(moe_dir, experts_implementation="grouped_mm")
    assert chosen.get_experts_implementation()[""] == "grouped_mm"


def test_the_module_hands_on_the_models_own_output(moe_dir):
    """`MoeTransformer.forward` calls the model on the features it takes and copies its output: the token
    embeddings, every layer's hidden states when asked, and the auxiliary loss, as the model returned them."""
    st = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    st.eval()
    module, model = st[0], st[0].auto_model
    randomize_experts(model, seed=3)
    features = st.preprocess(["a short text", "a somewhat longer text about routing"])
    inputs = {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        expected = model(**inputs, output_hidden_states=True)
        out = module(dict(features), output_hidden_states=True)
    assert torch.equal(out["token_embeddings"], expected.last_hidden_state)
    assert torch.equal(out["aux_loss"], expected.aux_loss) and out["aux_loss"] > 0
    assert len(out["all_layer_embeddings"]) == model.config.num_hidden_layers + 1


def test_the_module_reads_a_peft_wrapped_model(moe_dir):
    """A training run with `arch: lora` wraps the model in peft (`forward(*args, **kwargs)`): the module still
    hands it the features its base model takes, and the loss still arrives."""
    from peft import LoraConfig, get_peft_model

    st = SentenceTransformer(moe_dir, trust_remote_code=True, model_kwargs={"experts_implementation": "eager"})
    st.eval()
    features = st.preprocess(["a short text", "a somewhat longer text about routing"])
    with torch.no_grad():
        plain = st[0](dict(features))
    st[0].model = get_peft_model(st[0].auto_model, LoraConfig(r=2, target_modules=["query", "value"]))
    with torch.no_grad():
        wrapped = st[0](dict(features))  # LoRA B starts at zero: the same function
    torch.testing.assert_close(wrapped["token_embeddings"], plain["token_embeddings"])
    torch.testing.assert_close(wrapped["aux_loss"], plain["aux_loss"])
