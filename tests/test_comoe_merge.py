"""Merging CoMoE experts into a plain BERT folder."""

import json

import pytest
import torch
from conftest import TEXTS, randomize_lora_b, run_main
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer, BertModel

from moe_embed.convert.merge_experts import main as merge_main
from moe_embed.convert.merging import comoe_routing_weights
from moe_embed.convert.upcycle import main as upcycle_main
from moe_embed.modeling.modeling_comoe import CoMoeBertModel


def test_single_expert_merge_equals_the_model_and_needs_no_remote_code(tmp_path, capsys):
    upcycled = tmp_path / "e1"
    args = ["--arch", "comoe", "--num-local-experts", "1", "--num-experts-per-tok", "1", "--contrastive-loss-coef", "0"]
    code, err = run_main(upcycle_main, *args, "--output", str(upcycled), capsys=capsys)
    assert code == 0, err
    st = SentenceTransformer(str(upcycled), trust_remote_code=True)
    randomize_lora_b(st[0].auto_model, seed=2)
    trained = tmp_path / "trained"
    st.save(str(trained))
    merged = tmp_path / "merged"
    code, err = run_main(merge_main, str(trained), "--output", str(merged), capsys=capsys)
    assert code == 0, err

    config = json.loads((merged / "config.json").read_text())
    assert config["model_type"] == "bert" and "auto_map" not in config
    assert not list(merged.glob("*.py"))
    dense = AutoModel.from_pretrained(str(merged)).eval()  # no trust_remote_code
    assert type(dense) is BertModel
    comoe = st[0].auto_model.eval()
    tokenizer = AutoTokenizer.from_pretrained(str(merged))
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = comoe(**batch).last_hidden_state
        got = dense(**batch).last_hidden_state
    mask = batch["attention_mask"].bool()
    assert (expected - dense_reference(trained, batch)).abs().max() > 1e-3  # the expert changes the model
    assert (got[mask] - expected[mask]).abs().max() <= 1e-5
    st_merged = SentenceTransformer(str(merged))
    assert (
        st_merged.encode(TEXTS, convert_to_tensor=True) - st.encode(TEXTS, convert_to_tensor=True)
    ).abs().max() <= 1e-5


def dense_reference(folder, batch):
    """The CoMoE model of `folder` with its experts switched off (B = 0): the frozen base."""
    model = CoMoeBertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("lora_B"):
                param.zero_()
        return model(**batch).last_hidden_state


def test_calibration_weights_are_routing_shares_and_the_merge_folds_them():
    from conftest import tiny_comoe_config

    model = CoMoeBertModel(tiny_comoe_config()).eval()
    randomize_lora_b(model)

    class Tokenizer:  # token ids straight from the text: "3 5 7" -> [3, 5, 7]
        def __call__(self, texts, **kwargs):
            rows = [[int(t) for t in text.split()] for text in texts]
            width = max(map(len, rows))
            ids = torch.tensor([r + [0] * (width - len(r)) for r in rows])
            return {"input_ids": ids, "attention_mask": (ids != 0).long()}

    texts = ["5 8 13 21", "34 55", "89 144 233"]
    shares = comoe_routing_weights(model, Tokenizer(), texts, batch_size=2)
    assert shares.shape == (8, 4)
    torch.testing.assert_close(shares.sum(dim=1), torch.ones(8, dtype=torch.float64))
    state = model.merged_state_dict(shares)
    assert not any(k.endswith(("lora_A", "lora_B", "router.weight")) for k in state)
    linear = model.get_submodule("encoder.layer.1.attention.self.value")
    row = model.config.adapted_linears().index("encoder.layer.1.attention.self.value")
    expected = linear.weight.double() + model.config.lora_scaling * sum(
        shares[row, e] * linear.lora_B[e].double() @ linear.lora_A[e].double() for e in range(4)
    )
    torch.testing.assert_close(state["encoder.layer.1.attention.self.value.weight"].double(), expected)


def test_merge_with_calibration_prints_the_agreement(comoe_dir, tmp_path, capsys):
    st = SentenceTransformer(comoe_dir, trust_remote_code=True)
    randomize_lora_b(st[0].auto_model, seed=1, std=0.01)
    trained = tmp_path / "trained"
    st.save(str(trained))
    calibration = tmp_path / "calibration.txt"
    calibration.write_text("\n".join(TEXTS * 3) + "\n")
    merged = tmp_path / "merged"
    merge_main([str(trained), "--output", str(merged), "--calibration", str(calibration)])
    printed = capsys.readouterr().out
    cosine = float(printed.split("calibration texts: ")[1].split()[0])
    assert 0.9 < cosine <= 1.0 + 1e-6
    card = (merged / "README.md").read_text()
    assert "mean routing weight on calibration texts" in card and "approximates the CoMoE model" in card


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "query"], "--task and --experts do not apply to CoMoE"),
        (["--weights", "1,2"], "--weights has 2 values for 4 experts"),
    ],
)
def test_merge_comoe_bad_options(comoe_dir, tmp_path, capsys, args, message):
    code, err = run_main(merge_main, comoe_dir, "--output", str(tmp_path / "m"), *args, capsys=capsys)
    assert code == 2 and message in err
