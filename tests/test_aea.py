"""AEA (adaptive expert allocation): the controller on every supported MoE family and experts backend,
the allocation rules, and embeddings that do not depend on the rest of the batch."""

import itertools
import random

import pytest
import torch
from conftest import AEA_FAMILIES, tiny_family_model

import moe_embed.modeling.aea_controller as aea_controller
from moe_embed.modeling.aea_allocation import allocate_layers, allocate_tokens, attention_strength
from moe_embed.modeling.aea_controller import AdaptiveExpertAllocation
from moe_embed.modeling.aea_homogeneity import measure_homogeneity
from moe_embed.modeling.aea_layers import find_moe_layers, run_model
from moe_embed.modeling.aea_pooling import sentence_embedding

IMPLEMENTATIONS = ("eager", "grouped_mm", "batched_mm")


def batch(padding_side="right", seed=0):
    """Three rows of 9, 6 and 4 tokens, padded with id 0 on one side."""
    generator = torch.Generator().manual_seed(seed)
    lengths = (9, 6, 4)
    ids = torch.zeros(3, 9, dtype=torch.long)
    mask = torch.zeros(3, 9, dtype=torch.long)
    for row, length in enumerate(lengths):
        span = slice(0, length) if padding_side == "right" else slice(9 - length, 9)
        ids[row, span] = torch.randint(3, 120, (length,), generator=generator)
        mask[row, span] = 1
    return ids, mask


def layer_output(model, layer_index, ids, mask):
    """Output of layer `layer_index` (0-based) of the unmodified model."""
    _, layers = find_moe_layers(model)
    seen = []
    handle = layers[layer_index].layer.register_forward_hook(
        lambda m, a, out: seen.append(out[0] if isinstance(out, tuple) else out)
    )
    try:
        with torch.no_grad():
            run_model(getattr(model, "base_model", model), ids, mask)
    finally:
        handle.remove()
    return seen[0]


def run_aea(model, ids, mask, **kwargs):
    controller = AdaptiveExpertAllocation(model, **kwargs)
    with torch.no_grad(), controller.apply():
        return controller(ids, mask, output_routing_probs=True)


def first_moe_layer(model) -> int:
    _, layers = find_moe_layers(model)
    return next(i for i, h in enumerate(layers) if h.router is not None)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_original_top_k_for_every_token_is_bit_identical(family, implementation, monkeypatch):
    """Token-wise allocation that gives every token the router's own k leaves the model untouched.
    (No padding: padding tokens get no experts, which moves the rows an expert's matmul sees.)"""
    model = tiny_family_model(family, implementation)
    ids, mask = batch()
    mask = torch.ones_like(mask)
    reference = layer_output(model, 3, ids, mask)
    monkeypatch.setattr(aea_controller, "attention_strength", lambda probs, m: m.float())  # uniform: k_i = k_l
    out = run_aea(model, ids, mask, token_wise=True, exit_layer=4)
    real = mask.bool()
    assert torch.equal(out.hidden_states[real], reference[real])


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_layer_top_k_equals_a_model_built_with_that_k(family, implementation):
    model = tiny_family_model(family, implementation)
    rebuilt = tiny_family_model(family, implementation, num_experts_per_tok=3)
    rebuilt.load_state_dict(model.state_dict())
    ids, mask = batch()
    _, layers = find_moe_layers(model)
    layer_top_k = [3 if h.router is not None else None for h in layers]
    out = run_aea(model, ids, mask, layer_top_k=layer_top_k, exit_layer=4)
    reference = layer_output(rebuilt, 3, ids, mask)
    real = mask.bool()
    assert torch.equal(out.hidden_states[real], reference[real])
    assert not torch.equal(reference[real], layer_output(model, 3, ids, mask)[real])  # k matters


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_raising_one_tokens_k_changes_that_token_only(family, implementation, monkeypatch):
    model = tiny_family_model(family, implementation)
    ids, mask = batch()
    exit_layer = first_moe_layer(model) + 1  # the MoE layer's own output: attention has not spread it yet
    reference = layer_output(model, exit_layer - 1, ids, mask)

    def one_token_gets_more(strength, m, layer_k, cap, rounding="floor"):
        counts = m.long() * layer_k
        counts[0, 2] = layer_k + 2
        return counts

    monkeypatch.setattr(aea_controller, "allocate_tokens", one_token_gets_more)
    out = run_aea(model, ids, mask, token_wise=True, exit_layer=exit_layer)
    difference = (out.hidden_states - reference).abs().amax(dim=-1)
    tolerance = 1e-6 * max(1.0, reference.abs().max().item())  # 1e-6 relative to the hidden states' scale
    assert difference[0, 2] > 100 * tolerance
    difference[0, 2] = 0
    assert difference[mask.bool()].max() <= tolerance


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_each_token_computes_as_a_model_built_with_its_own_k(family, implementation, monkeypatch):
    """Tokens at k = 1 next to one at k = 3 equal the models built with top-1 and top-3: the router
    picks the largest k of the batch, the slots beyond a token's own k are dropped, and the kept
    weights are rescaled exactly where the router normalises them."""
    model = tiny_family_model(family, implementation)
    built = {}
    for k in (1, 3):
        built[k] = tiny_family_model(family, implementation, num_experts_per_tok=k)
        built[k].load_state_dict(model.state_dict())
    ids, mask = batch()
    exit_layer = first_moe_layer(model) + 1

    def k_one_but_one_token_three(strength, m, layer_k, cap, rounding="floor"):
        counts = m.long()
        counts[0, 2] = 3
        return counts

    monkeypatch.setattr(aea_controller, "allocate_tokens", k_one_but_one_token_three)
    out = run_aea(model, ids, mask, token_wise=True, exit_layer=exit_layer).hidden_states
    top1, top3 = (layer_output(built[k], exit_layer - 1, ids, mask) for k in (1, 3))
    tolerance = 1e-6 * max(1.0, top1.abs().max().item(), top3.abs().max().item())  # relative to the scale
    torch.testing.assert_close(out[0, 2], top3[0, 2], atol=tolerance, rtol=0)
    others = mask.bool().clone()
    others[0, 2] = False
    torch.testing.assert_close(out[others], top1[others], atol=tolerance, rtol=0)


@pytest.mark.parametrize("family", ("olmoe", "moe_bert"))
def test_dropped_slots_never_reach_the_experts_and_exited_layers_never_run(family, monkeypatch):
    """The experts get one row per kept (token, slot) only, and the layers after the exit layer do not run."""
    model = tiny_family_model(family, "grouped_mm")
    ids, mask = batch()
    _, layers = find_moe_layers(model)
    moe = [i for i, h in enumerate(layers) if h.router is not None]
    rows, ran = {}, []
    for i in moe:
        # a forward hook sees the arguments forward got, after the controller's pre-hook
        layers[i].experts.register_forward_hook(lambda m, args, out, i=i: rows.__setitem__(i, args[0].shape[0]))
    for i, h in enumerate(layers):
        h.layer.register_forward_hook(lambda m, a, out, i=i: ran.append(i))

    def one_expert_per_token(strength, m, layer_k, cap, rounding="floor"):
        counts = m.long()
        counts[0, 0] = 2
        return counts

    monkeypatch.setattr(aea_controller, "allocate_tokens", one_expert_per_token)
    run_aea(model, ids, mask, token_wise=True, exit_layer=moe[0] + 1)
    assert rows == {moe[0]: int(mask.sum()) + 1}  # every real token once, token (0, 0) twice; no padding
    assert ran == list(range(moe[0] + 1))


@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_hooks_are_removed_and_the_model_is_unchanged(family):
    model = tiny_family_model(family, "grouped_mm")
    ids, mask = batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    reference = layer_output(model, 3, ids, mask)
    _, layers = find_moe_layers(model)
    top_k = [h.router.top_k if h.router is not None else None for h in layers]
    run_aea(model, ids, mask, token_wise=True, rounding="largest-remainder", exit_layer=3)
    assert [h.router.top_k if h.router is not None else None for h in layers] == top_k
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(layer_output(model, 3, ids, mask), reference)


@pytest.mark.parametrize("family", AEA_FAMILIES)
def test_attention_strength_hook_matches_eager_probabilities(family, monkeypatch):
    """The strength the hook hands to the allocation is max over heads and real queries of the
    attention a token receives, computed here with loops from `output_attentions`."""
    model = tiny_family_model(family)
    ids, mask = batch("left" if family != "moe_bert" else "right")
    with torch.no_grad():
        kwargs = {"position_ids": (mask.cumsum(-1) - 1).clamp_min(0)} if family != "moe_bert" else {}
        attentions = model(input_ids=ids, attention_mask=mask, output_attentions=True, **kwargs).attentions
    seen = {}

    def record(strength, m, layer_k, cap, rounding="floor"):
        seen[len(seen)] = strength
        return m.long() * layer_k  # the original k: the model runs as without AEA

    monkeypatch.setattr(aea_controller, "allocate_tokens", record)
    run_aea(model, ids, mask, token_wise=True, exit_layer=4)
    moe_layers = [i for i, h in enumerate(find_moe_layers(model)[1]) if h.router is not None]
    assert len(seen) == len(moe_layers)
    for call, layer in enumerate(moe_layers):
        probs = attentions[layer]
        expected = torch.zeros(mask.shape)
        for row, token in itertools.product(range(mask.shape[0]), range(mask.shape[1])):
            if mask[row, token]:
                queries = [q for q in range(mask.shape[1]) if mask[row, q]]
                heads = range(probs.shape[1])
                expected[row, token] = max(probs[row, h, q, token].item() for h in heads for q in queries)
        torch.testing.assert_close(seen[call], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("embedding", ("hidden", "moee-sum"))
@pytest.mark.parametrize("rounding", ("floor", "largest-remainder"))
@pytest.mark.parametrize("padding_side", ("left", "right"))
@pytest.mark.parametrize("family", ("olmoe", "deepseek_v3", "moe_bert"))
def test_embedding_alone_equals_embedding_in_a_padded_batch(family, padding_side, rounding, embedding):
    model = tiny_family_model(family, "grouped_mm")
    pooling = "mean" if family == "moe_bert" else "last"
    ids, mask = batch(padding_side)
    homogeneity = measure_homogeneity(model, [(ids, mask)])
    _, layers = find_moe_layers(model)
    layer_top_k, _ = allocate_layers(homogeneity, 2, [h.cap for h in layers], alpha=2.0, exit_layer=3)
    kwargs = dict(layer_top_k=layer_top_k, token_wise=True, rounding=rounding, exit_layer=3)
    batched = sentence_embedding(run_aea(model, ids, mask, **kwargs), mask, pooling, embedding)
    for row in range(ids.shape[0]):
        real = mask[row].bool()
        alone_ids, alone_mask = ids[row : row + 1, real], mask[row : row + 1, real]
        alone = sentence_embedding(run_aea(model, alone_ids, alone_mask, **kwargs), alone_mask, pooling, embedding)
        torch.testing.assert_close(batched[row : row + 1], alone, atol=1e-5, rtol=1e-5)


def test_allocation_changes_the_embedding():
    """AEA is not a no-op: a reallocated budget moves the embedding (else every test above passes trivially)."""
    model = tiny_family_model("olmoe")
    ids, mask = batch()
    plain = sentence_embedding(run_aea(model, ids, mask, exit_layer=3), mask, "last")
    adapted = sentence_embedding(run_aea(model, ids, mask, token_wise=True, exit_layer=3), mask, "last")
    assert (plain - adapted).abs().max() > 1e-3


# ---- allocation rules ------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_layer_allocation_spends_the_budget_within_bounds_and_is_monotone(seed):
    rng = random.Random(seed)
    num_layers = rng.randint(2, 12)
    homogeneity = [None if rng.random() < 0.2 else rng.uniform(-0.1, 0.95) for _ in range(num_layers)]
    if all(s is None for s in homogeneity):
        homogeneity[-1] = 0.5
    num_experts, top_k = rng.choice([(8, 2), (64, 8), (4, 1), (60, 4)])
    moe = [i for i, s in enumerate(homogeneity) if s is not None]
    exit_layer = rng.randint(moe[0] + 1, num_layers)
    caps = [num_experts if s is not None else None for s in homogeneity]
    alpha = rng.choice([0.0, 1.0, 3.0, 9.0])
    counts, unspent = allocate_layers(homogeneity, top_k, caps, alpha=alpha, exit_layer=exit_layer)
    kept = [i for i in moe if i < exit_layer]
    assert all(counts[i] is None for i in range(num_layers) if homogeneity[i] is None)
    assert all(counts[i] == 0 for i in moe if i >= exit_layer)
    assert all(1 <= counts[i] <= num_experts for i in kept)
    assert sum(counts[i] for i in kept) + unspent == top_k * len(moe)
    assert unspent == max(0, top_k * len(moe) - num_experts * len(kept))
    for a, b in itertools.permutations(kept, 2):
        if homogeneity[a] < homogeneity[b]:
            assert counts[a] >= counts[b]  # fewer experts where experts agree


def test_layer_allocation_follows_the_paper_formula():
    """Without bounds that bind: round(K_total · (1 − s)^α / Σ(1 − s)^α), then the residual correction."""
    homogeneity = [0.9, 0.5, 0.2, 0.6]
    counts, unspent = allocate_layers(homogeneity, 4, [16] * 4, alpha=1.0)
    # shares 16 · (0.1, 0.5, 0.8, 0.4) / 1.8 = 0.89, 4.44, 7.11, 3.56 -> at least 1, then 4, 7, 4 (sum 16)
    assert counts == [1, 4, 7, 4] and unspent == 0
    # early exit after layer 2: layers 0 and 1 share the whole budget of 16
    counts, _ = allocate_layers(homogeneity, 4, [16] * 4, alpha=1.0, exit_layer=2)
    assert counts == [3, 13, 0, 0]
    # the shifted form (c − s)^α, negative bases at 0 (floored to one expert)
    counts, _ = allocate_layers([0.05, 0.02, 0.2], 2, [8] * 3, alpha=1.0, shift=0.1)
    assert counts == [2, 3, 1]


def test_layer_allocation_states_the_unspent_budget_where_caps_bind():
    counts, unspent = allocate_layers([0.1, 0.2, 0.3, 0.4], 4, [4] * 4, alpha=1.0, exit_layer=2)
    assert counts == [4, 4, 0, 0] and unspent == 8


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(alpha=-1.0), "alpha"),
        (dict(exit_layer=0), "exit_layer"),
        (dict(exit_layer=5), "exit_layer"),
        (dict(shift=0.1), "shift"),
    ],
)
def test_layer_allocation_rejects_bad_settings(arguments, message):
    with pytest.raises(ValueError, match=message):
        allocate_layers([0.5, 0.6, 0.7, 0.8], 2, [8] * 4, **arguments)


@pytest.mark.parametrize("seed", range(10))
def test_token_allocation_bounds_and_budget(seed):
    generator = torch.Generator().manual_seed(seed)
    strength = torch.rand(4, 12, generator=generator) ** 4  # skewed, as attention is
    strength[1, 0] = 50.0  # one token would take far more than the cap
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[2, 7:] = 0
    mask[3, :5] = 0
    for layer_k, cap in [(2, 8), (4, 4), (1, 3)]:
        floor = allocate_tokens(strength, mask, layer_k, cap, "floor")
        exact = allocate_tokens(strength, mask, layer_k, cap, "largest-remainder")
        budget = layer_k * mask.sum(dim=-1)
        for counts in (floor, exact):
            assert counts.min() >= 0 and counts.max() <= cap
            assert (counts[mask == 0] == 0).all()
        assert (floor.sum(dim=-1) <= budget).all()
        assert torch.equal(exact.sum(dim=-1), budget)
        assert (exact >= floor).all()


def test_token_allocation_follows_the_paper_formula():
    strength = torch.tensor([[0.5, 0.25, 0.125, 0.125, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    # B = 2 · 4 = 8, p = (0.5, 0.25, 0.125, 0.125): floor(8 p) = (4, 2, 1, 1)
    assert allocate_tokens(strength, mask, 2, 8).tolist() == [[4, 2, 1, 1, 0]]
    strength = torch.tensor([[0.6, 0.3, 0.1]])
    mask = torch.ones(1, 3, dtype=torch.long)
    # B = 3: 3 p = (1.8, 0.9, 0.3) -> floor (1, 0, 0); largest remainder adds to 0.9 then 0.8
    assert allocate_tokens(strength, mask, 1, 8, "floor").tolist() == [[1, 0, 0]]
    assert allocate_tokens(strength, mask, 1, 8, "largest-remainder").tolist() == [[2, 1, 0]]
    # uniform strength: every token gets exactly k, whatever the rounding of 1/T
    assert allocate_tokens(torch.ones(1, 7), torch.ones(1, 7), 3, 8).tolist() == [[3] * 7]


def test_attention_strength_ignores_padding_queries_and_keys():
    probs = torch.rand(1, 2, 3, 3)
    probs[0, :, 2, :] = float("nan")  # a padding query row may hold anything
    mask = torch.tensor([[1, 1, 0]])
    strength = attention_strength(probs, mask)
    expected = probs[0, :, :2, :].amax(dim=(0, 1))
    assert torch.equal(strength[0, :2], expected[:2]) and strength[0, 2] == 0


# ---- the controller's checks ----------------------------------------------------------------------


def test_group_limited_routing_caps_k():
    model = tiny_family_model("deepseek_v3")
    _, layers = find_moe_layers(model)
    assert [h.cap for h in layers if h.router is not None] == [4, 4, 4]  # topk_group 2 of 4 groups of 2
    with pytest.raises(ValueError, match="outside 0..4"):
        AdaptiveExpertAllocation(model, layer_top_k=[None, 5, 2, 2])


def test_token_wise_allocation_switches_the_model_to_the_eager_attention_it_reads(monkeypatch):
    """A model loaded as `AutoModel` loads it (sdpa) is switched to eager attention by the controller, and computes
    what the model loaded with eager attention computes; one that cannot switch is refused in one line."""
    from transformers import AutoModel

    eager = tiny_family_model("olmoe")
    sdpa = AutoModel.from_config(eager.config, attn_implementation="sdpa").eval()
    sdpa.load_state_dict(eager.state_dict())
    assert sdpa.config._attn_implementation == "sdpa"
    ids, mask = batch()
    expected = run_aea(eager, ids, mask, token_wise=True)
    out = run_aea(sdpa, ids, mask, token_wise=True)
    assert sdpa.config._attn_implementation == "eager"
    assert torch.allclose(out.last_hidden_state, expected.last_hidden_state, atol=1e-5)

    layer_wise = AutoModel.from_config(eager.config, attn_implementation="sdpa").eval()
    run_aea(layer_wise, ids, mask, exit_layer=3)  # layer-wise allocation works on any attention, and keeps it
    assert layer_wise.config._attn_implementation == "sdpa"
    monkeypatch.setattr(type(layer_wise), "set_attn_implementation", lambda self, name: None)  # cannot switch
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        AdaptiveExpertAllocation(layer_wise, token_wise=True)
    monkeypatch.undo()

    controller = AdaptiveExpertAllocation(layer_wise, token_wise=True)
    layer_wise.set_attn_implementation("sdpa")  # switched back after construction: the hook says so
    with pytest.raises(ValueError, match="attn_implementation='eager'"), torch.no_grad(), controller.apply():
        controller(ids, mask)


def test_called_with_what_a_tokenizer_returns_it_answers_last_hidden_state(moe_dir):
    """`aea(**tokenizer(texts))`, as a transformers model is called: `token_type_ids` reach the model, and the
    exit layer's output is `last_hidden_state` (also `out[0]`), as in the model's own output."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(moe_dir, trust_remote_code=True)
    model = AutoModel.from_pretrained(moe_dir, trust_remote_code=True).eval()
    features = tokenizer(["a man plays a guitar", "a dog"], padding=True, return_tensors="pt")
    assert "token_type_ids" in features
    ones = {**features, "token_type_ids": torch.ones_like(features["input_ids"])}
    controller = AdaptiveExpertAllocation(model)  # the model's own k, every layer: the model's own function
    with torch.no_grad(), controller.apply():
        out = controller(**features)
        second = controller(**ones)
    with torch.no_grad():
        expected, expected_second = model(**features).last_hidden_state, model(**ones).last_hidden_state
    assert torch.equal(out.last_hidden_state, expected) and out[0] is out.last_hidden_state
    assert out.hidden_states is out.last_hidden_state  # the name it had first
    assert torch.equal(second.last_hidden_state, expected_second)  # the type ids were read, not dropped
    assert not torch.allclose(expected_second, expected)


def test_a_model_without_token_types_ignores_them():
    model = tiny_family_model("olmoe")
    ids, mask = batch()
    plain = run_aea(model, ids, mask, token_wise=True)
    controller = AdaptiveExpertAllocation(model, token_wise=True)
    with torch.no_grad(), controller.apply():
        out = controller(input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids))
    assert torch.equal(out.last_hidden_state, plain.last_hidden_state)


@pytest.mark.parametrize(
    "model_type, settings",
    [
        ("jetmoe", dict(num_local_experts=4, num_experts_per_tok=2, kv_channels=8)),
        ("phimoe", dict(num_local_experts=4, num_experts_per_tok=2)),
        ("llama", dict()),
    ],
)
def test_unsupported_families_are_named(model_type, settings):
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        **settings,
    )
    model = AutoModel.from_config(config)
    with pytest.raises(ValueError, match="AEA supports: deepseek_v2, deepseek_v3, granitemoe, mixtral, moe_bert"):
        AdaptiveExpertAllocation(model)


def test_layer_top_k_must_match_the_layers():
    model = tiny_family_model("qwen2_moe")  # layer 0 is dense
    with pytest.raises(ValueError, match="layer 0 is dense"):
        AdaptiveExpertAllocation(model, layer_top_k=[2, 2, 2, 2])
    with pytest.raises(ValueError, match="4 layers"):
        AdaptiveExpertAllocation(model, layer_top_k=[None, 2, 2])
    with pytest.raises(ValueError, match="k = 0"):
        AdaptiveExpertAllocation(model, layer_top_k=[None, 2, 0, 2], exit_layer=4)


def test_homogeneity_of_identical_experts_is_one():
    """Upcycled copies agree exactly; experts made to differ agree less."""
    model = tiny_family_model("moe_bert")
    ids, mask = batch()
    with torch.no_grad():
        for h in find_moe_layers(model)[1]:
            if h.router is not None:
                for param in h.experts.parameters():
                    param.copy_(param[:1].expand_as(param))
    homogeneity = measure_homogeneity(model, [(ids, mask)])
    assert [s if s is None else round(s, 5) for s in homogeneity] == [None, 1.0, None, 1.0]
    perturbed = tiny_family_model("moe_bert")
    assert all(s < 0.99 for s in measure_homogeneity(perturbed, [(ids, mask)]) if s is not None)


@pytest.mark.parametrize("padding_side", ("left", "right"))
@pytest.mark.parametrize("family", ("olmoe", "moe_bert"))
def test_homogeneity_reads_each_texts_final_real_token(family, padding_side):
    """In a padded batch the homogeneity equals the mean over the texts measured one at a time, where
    the final real token is simply the last row (both row layouts: every token, real tokens only)."""
    model = tiny_family_model(family)
    ids, mask = batch(padding_side)
    alone = [
        measure_homogeneity(model, [(ids[row : row + 1, mask[row].bool()], mask[row : row + 1, mask[row].bool()])])
        for row in range(ids.shape[0])
    ]
    batched = measure_homogeneity(model, [(ids, mask)])
    for layer, value in enumerate(batched):
        if value is None:
            continue
        assert value == pytest.approx(sum(a[layer] for a in alone) / len(alone), abs=1e-5)
