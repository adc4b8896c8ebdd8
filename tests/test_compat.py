"""modeling/compat.py: what stands in for transformers 5 names on 4.x gives 5.x's results (the whole model on
the real 4.57 stack is checked by scripts/test_old_stack.sh)."""

import pytest
import torch
from conftest import TEXTS, read_json

from moe_embed.modeling.compat import REQUIREMENTS, legacy_bidirectional_mask
from moe_embed.modeling.modeling_mote import MoteBertModel


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_legacy_padding_mask_gives_the_same_outputs(implementation, mote_dir, tokenizer, monkeypatch):
    model = MoteBertModel.from_pretrained(mote_dir, attn_implementation=implementation).eval()
    batch = tokenizer(["search_query: " + t for t in TEXTS], padding=True, return_tensors="pt")
    assert not bool(batch["attention_mask"].all())
    with torch.no_grad():
        expected = model(**batch).last_hidden_state
        monkeypatch.setattr("moe_embed.modeling.modeling_encoder.create_bidirectional_mask", legacy_bidirectional_mask)
        got = model(**batch).last_hidden_state
    real = batch["attention_mask"].bool()
    assert torch.allclose(got[real], expected[real], atol=1e-6)  # masks of other shapes may take other kernels


def test_folders_state_the_versions_they_need(mote_dir):
    assert read_json(f"{mote_dir}/config.json")["requirements"] == REQUIREMENTS
    card = open(f"{mote_dir}/README.md").read()
    assert "Runs on sentence-transformers >=5.1, torch >=2.4, transformers >=4.57" in card


def test_portable_module_files_load_alike_on_sentence_transformers_6(mote_dir, tmp_path):
    """A folder saved by sentence-transformers 6 (as training saves) rewritten to the 5.x module forms
    loads on 6.x with the same embeddings (`scripts/test_old_stack.sh` loads it on 5.1)."""
    from sentence_transformers import SentenceTransformer

    from moe_embed.modeling.st_folder import write_portable_module_files

    original = SentenceTransformer(mote_dir, trust_remote_code=True)
    original.save(str(tmp_path / "resaved"))
    write_portable_module_files(tmp_path / "resaved")
    modules = read_json(tmp_path / "resaved" / "modules.json")
    assert [m["type"] for m in modules[1:]] == [
        "sentence_transformers.models.Pooling",
        "sentence_transformers.models.Normalize",
    ]
    pooling = read_json(tmp_path / "resaved" / "1_Pooling" / "config.json")
    hidden = read_json(f"{mote_dir}/config.json")["hidden_size"]
    assert pooling["word_embedding_dimension"] == hidden and pooling["pooling_mode_mean_tokens"] is True
    reloaded = SentenceTransformer(str(tmp_path / "resaved"), trust_remote_code=True)
    for kwargs in ({}, {"task": "clustering"}, {"prompt_name": "query"}):
        assert torch.equal(
            reloaded.encode(TEXTS, convert_to_tensor=True, **kwargs),
            original.encode(TEXTS, convert_to_tensor=True, **kwargs),
        )
