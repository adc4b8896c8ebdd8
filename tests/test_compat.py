"""modeling/compat.py: what stands in for transformers 5 names on 4.x gives 5.x's results (the whole model on
the real 4.57 stack is checked by scripts/test_old_stack.sh)."""

import pytest
import torch
from conftest import TEXTS, read_json

from modeling.compat import REQUIREMENTS, legacy_bidirectional_mask
from modeling.modeling_mote import MoteBertModel


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_legacy_padding_mask_gives_the_same_outputs(implementation, mote_dir, tokenizer, monkeypatch):
    model = MoteBertModel.from_pretrained(mote_dir, attn_implementation=implementation).eval()
    batch = tokenizer(["search_query: " + t for t in TEXTS], padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all())
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
        monkeypatch.setattr("modeling.modeling_encoder.create_bidirectional_mask", legacy_bidirectional_mask)
        got = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert torch.equal(got[real], expected[real])


def test_folders_state_the_versions_they_need(mote_dir):
    assert read_json(f"{mote_dir}/config.json")["requirements"] == REQUIREMENTS
    card = open(f"{mote_dir}/README.md").read()
    assert "Runs on sentence-transformers >=5.1, torch >=2.4, transformers >=4.57" in card
