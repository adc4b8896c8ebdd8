"""CoMoE-PEFT: routing, the contrastive expert loss, padding, freezing and bad configs."""

import math
import threading

import pytest
import torch
from conftest import randomize_lora_b, sharpen_routers, tiny_comoe_config, top_k_margin

from moe_embed.modeling.comoe_layer import CoMoeLinear, contrastive_expert_loss, expert_similarities
from moe_embed.modeling.configuration_comoe import resolve_target_modules
from moe_embed.modeling.modeling_comoe import CoMoeBertModel


def gram(reps):
    """Pairwise dot products `(tokens, E, E)` of unit representations: the loss's similarities."""
    return reps @ reps.transpose(1, 2)


def direct_loss(reps, index, slots, tau, eps):
    """Algorithm 1 written out token by token, with Python sums."""
    losses = []
    for t in range(reps.shape[0]):
        active = [int(e) for e in index[t]]
        anchor = active[int(slots[t])]
        q = reps[t, anchor]
        positives = [math.exp(float(q @ reps[t, e]) / tau) for e in active if e != anchor]
        negatives = [math.exp(float(q @ reps[t, e]) / tau) for e in range(reps.shape[1]) if e not in active]
        losses.append(-math.log(sum(positives) / (sum(positives) + sum(negatives) + eps)))
    return sum(losses) / len(losses)


def test_contrastive_loss_equals_a_direct_computation():
    generator = torch.Generator().manual_seed(1)
    reps = torch.nn.functional.normalize(torch.randn(3, 4, 6, generator=generator), dim=-1)
    index = torch.tensor([[0, 2], [3, 1], [1, 2]])
    slots = torch.tensor([0, 1, 1])  # anchors: experts 0, 1, 2
    for tau, eps in [(0.07, 1e-3), (1.0, 0.0), (0.5, 0.1)]:
        got = contrastive_expert_loss(gram(reps), index, slots, tau, eps).item()
        assert got == pytest.approx(direct_loss(reps, index, slots, tau, eps), rel=1e-5)
    # k = E: no negatives, the loss is -log(Σpos / (Σpos + ε)) > 0 only through ε
    full = torch.tensor([[0, 1, 2, 3]] * 3)
    got = contrastive_expert_loss(gram(reps), full, torch.tensor([0, 2, 3]), 0.1, 1e-3).item()
    expected = direct_loss(reps, full, torch.tensor([0, 2, 3]), 0.1, 1e-3)
    assert 0 < expected < 1e-3 and got == pytest.approx(expected, abs=1e-7)  # fp32: a difference of two logs


def test_identical_experts_give_the_loss_of_indistinguishable_experts():
    # all representations equal: every score is 1/τ, loss = log((E - 1) / (k - 1)) up to ε
    reps = torch.nn.functional.normalize(torch.ones(5, 4, 3), dim=-1)
    index = torch.tensor([[0, 1]] * 5)
    got = contrastive_expert_loss(gram(reps), index, torch.zeros(5, dtype=torch.long), 0.5, 0.0).item()
    assert got == pytest.approx(math.log(3 / 1), rel=1e-6)


def test_linear_matches_the_routing_formula():
    config = tiny_comoe_config()
    linear = CoMoeLinear(32, 24, config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in linear.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
    x = torch.randn(2, 5, 32, generator=generator)
    got = linear(x)
    flat = x.reshape(-1, 32)
    expected = []
    for token in flat:
        probs = torch.softmax(linear.router.weight @ token, dim=-1)
        top = torch.topk(probs, 2)
        weights = top.values / top.values.sum()
        y = linear.weight @ token + linear.bias
        for w, e in zip(weights, top.indices, strict=True):
            y = y + w * config.lora_scaling * linear.lora_B[e] @ (linear.lora_A[e] @ token)
        expected.append(y)
    torch.testing.assert_close(got.reshape(-1, 24), torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_training_path_equals_inference_path():
    # Training computes every expert's output (for the loss); inference the chosen ones only.
    model = CoMoeBertModel(tiny_comoe_config())
    randomize_lora_b(model)
    sharpen_routers(model)
    ids = torch.randint(5, 1000, (3, 9))
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0
    with torch.no_grad():
        train_out = model.train()(input_ids=ids, attention_mask=mask)
        eval_out = model.eval()(input_ids=ids, attention_mask=mask, output_router_logits=True)
    assert top_k_margin(eval_out.router_logits, 2) > 1e-3  # no routing decision is knife-edge
    assert train_out.contrastive_loss is not None and eval_out.contrastive_loss is None
    real = mask.bool()
    torch.testing.assert_close(train_out.last_hidden_state[real], eval_out.last_hidden_state[real], atol=1e-5, rtol=0)
    assert torch.equal(train_out.expert_counts, eval_out.expert_counts)


def test_outputs_counts_and_router_logits():
    config = tiny_comoe_config(adapter_layers="1", target_modules="query,output.dense")
    assert config.target_modules == ["attention.self.query", "attention.output.dense", "output.dense"]
    model = CoMoeBertModel(config).eval()
    ids = torch.randint(5, 1000, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
    assert out.expert_counts.shape == (3, 4)
    assert out.expert_counts.sum(dim=1).tolist() == [10 * 2] * 3  # 10 real tokens, top-2 each
    assert [tuple(x.shape) for x in out.router_logits] == [(10, 4)] * 3
    assert all(x.dtype == torch.float32 for x in out.router_logits)
    assert config.adapted_linears()[0] == "encoder.layer.1.attention.self.query"
    assert model(input_ids=ids, attention_mask=mask).router_logits is None
    assert out.aux_loss.item() == 0.0  # eval, no load balancing: nothing to add


def test_upcycled_model_equals_its_base_and_only_adapters_train():
    model = CoMoeBertModel(tiny_comoe_config()).eval()  # B = 0 by initialisation
    ids = torch.randint(5, 1000, (2, 7))
    with torch.no_grad():
        out = model(input_ids=ids).last_hidden_state
        for module in model.modules():
            if isinstance(module, CoMoeLinear):
                module.lora_A.zero_()  # the experts contribute nothing either way
        assert torch.equal(out, model(input_ids=ids).last_hidden_state)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(name.endswith(("lora_A", "lora_B", "router.weight")) for name in trainable)
    assert len(trainable) == 3 * 4 * 2  # 3 tensors x 4 linears x 2 layers


def test_loss_and_gradients_are_finite_at_step_zero_and_move_the_experts():
    # B = 0: every expert output is zero. The loss must be finite and still give A a gradient.
    model = CoMoeBertModel(tiny_comoe_config()).train()
    ids = torch.randint(5, 1000, (3, 8))
    mask = torch.ones_like(ids)
    mask[2, 5:] = 0
    out = model(input_ids=ids, attention_mask=mask)
    assert torch.isfinite(out.contrastive_loss) and torch.isfinite(out.aux_loss)
    assert out.aux_loss.item() == pytest.approx(0.01 * out.contrastive_loss.item(), rel=1e-6)
    out.contrastive_loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    assert all(g is None or torch.isfinite(g).all() for g in grads.values())
    a_grads = [g for name, g in grads.items() if name.endswith("lora_A")]
    assert all(g is not None and g.abs().sum() > 0 for g in a_grads)
    # the last linear's B reaches no later expert, and its own outputs are zero: no direction yet
    assert grads["encoder.layer.1.attention.output.dense.lora_B"].abs().sum() == 0

    # Once B has moved, the outputs take part: B gets a gradient from the loss too.
    randomize_lora_b(model, std=0.01)
    model.zero_grad()
    model(input_ids=ids, attention_mask=mask).contrastive_loss.backward()
    assert all(p.grad.abs().sum() > 0 for name, p in model.named_parameters() if name.endswith("lora_B"))


def direct_representations(codes, lora_b):
    """Each expert's code and output made unit vectors (0 for a zero vector), concatenated, / √2."""

    def unit(v):
        norms = v.norm(dim=-1, keepdim=True)
        return torch.where(norms > 0, v / norms.clamp_min(1e-30), torch.zeros_like(v))

    outputs = torch.stack([codes[:, e] @ lora_b[e].T for e in range(lora_b.shape[0])], dim=1)
    return torch.cat([unit(codes), unit(outputs)], dim=-1) / math.sqrt(2)


def test_expert_similarities_are_cosines_of_codes_and_outputs_and_zero_outputs_count_zero():
    generator = torch.Generator().manual_seed(4)
    codes, lora_b = torch.randn(5, 4, 3, generator=generator), torch.randn(4, 7, 3, generator=generator)
    got = expert_similarities(codes, lora_b)
    torch.testing.assert_close(got, gram(direct_representations(codes, lora_b)), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.diagonal(got, dim1=1, dim2=2), torch.ones(5, 4))
    zero_b = torch.zeros_like(lora_b)  # upcycled: outputs zero, only the codes' cosine (halved) remains
    got = expert_similarities(codes, zero_b)
    torch.testing.assert_close(got, gram(direct_representations(codes, zero_b)), atol=1e-6, rtol=0)
    torch.testing.assert_close(torch.diagonal(got, dim1=1, dim2=2), torch.full((5, 4), 0.5))


def test_lambda_zero_gives_no_contrastive_gradient():
    model = CoMoeBertModel(tiny_comoe_config(contrastive_loss_coef=0.0)).train()
    randomize_lora_b(model)
    out = model(input_ids=torch.randint(5, 1000, (2, 6)))
    assert out.contrastive_loss is None
    assert out.aux_loss.item() == 0.0 and not out.aux_loss.requires_grad


def test_padding_changes_no_real_output_and_no_loss():
    config = tiny_comoe_config(router_aux_loss_coef=0.5)
    model = CoMoeBertModel(config).train()
    randomize_lora_b(model)
    sharpen_routers(model)
    ids = torch.randint(5, 1000, (2, 6))
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3])
    padded_ids = torch.cat([ids, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    padded_mask = torch.cat([mask, torch.zeros(2, 4, dtype=torch.long)], dim=1)
    outs = []
    for batch_ids, batch_mask in [(ids, mask), (padded_ids, padded_mask)]:
        torch.manual_seed(5)  # the same anchor draws: one per real token either way
        outs.append(model(input_ids=batch_ids, attention_mask=batch_mask, output_router_logits=True))
    short, long = outs
    assert top_k_margin(short.router_logits, 2) > 1e-3
    real = mask.bool()
    torch.testing.assert_close(short.last_hidden_state[real], long.last_hidden_state[:, :6][real], atol=1e-5, rtol=0)
    assert torch.equal(short.expert_counts, long.expert_counts)
    for a, b in zip(short.router_logits, long.router_logits, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    torch.testing.assert_close(short.contrastive_loss, long.contrastive_loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(short.aux_loss, long.aux_loss, atol=1e-5, rtol=0)


def test_concurrent_forward_passes_do_not_mix():
    model = CoMoeBertModel(tiny_comoe_config()).eval()
    randomize_lora_b(model)
    sharpen_routers(model)
    batches = [torch.randint(5, 1000, (2, n)) for n in (4, 9, 6, 12)]
    with torch.no_grad():
        expected = [model(input_ids=b).expert_counts for b in batches]
        assert min(top_k_margin(model(input_ids=b, output_router_logits=True).router_logits, 2) for b in batches) > 1e-3
    results = [None] * len(batches)

    def run(i):
        with torch.no_grad():
            for _ in range(5):
                results[i] = model(input_ids=batches[i]).expert_counts

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(r, e) for r, e in zip(results, expected, strict=True))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"num_experts_per_tok": 5}, r"num_experts_per_tok` \(5\) must lie in 1..num_local_experts \(4\)"),
        ({"lora_rank": 0}, "`lora_rank` must be a positive integer, got 0"),
        (
            {"target_modules": "query,qkv"},
            "unknown target module 'qkv'; expected .*query, key, value, attention.output",
        ),
        ({"num_experts_per_tok": 1}, "contrastive expert loss needs num_experts_per_tok >= 2"),
        ({"adapter_layers": "7"}, r"adapter_layers` holds layer indices \[7\] out of range"),
        ({"lora_dropout": 1.0}, r"lora_dropout` must lie in \[0, 1\)"),
    ],
)
def test_bad_config_is_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        tiny_comoe_config(**overrides)


def test_target_modules_follow_peft_matching():
    assert resolve_target_modules("dense") == ["attention.output.dense", "intermediate.dense", "output.dense"]
    assert resolve_target_modules(["value", "intermediate.dense"]) == ["attention.self.value", "intermediate.dense"]
    with pytest.raises(ValueError, match="must name at least one linear"):
        resolve_target_modules(" , ")
