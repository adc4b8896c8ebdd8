"""A saved MoTE folder loads in a fresh interpreter that cannot import this repository."""

import json

import pytest
import torch
from conftest import TEXTS, randomize_experts, run_isolated
from sentence_transformers import SentenceTransformer

from moe_embed.modeling.modeling_mote import MoteBertModel

LOAD_AND_ENCODE = """
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
from sentence_transformers import SentenceTransformer
folder, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
assert model.__class__.__module__.startswith("transformers_modules"), model.__class__.__module__
tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
result = {"auto": {}, "st": {}}
with torch.no_grad():
    for task in model.config.tasks:
        batch = tokenizer([model.config.task_prefixes[task] + t for t in texts], padding=True, return_tensors="pt")
        result["auto"][task] = model(**batch).last_hidden_state.tolist()
st = SentenceTransformer(folder, trust_remote_code=True)
for name in st.prompts:
    result["st"][name] = st.encode(texts, prompt_name=name).tolist()
print(json.dumps(result))
"""


@pytest.mark.slow
def test_trained_model_round_trips_through_a_fresh_process(mote_dir, tmp_path):
    # Make the experts differ (as after training), save through the ST API, reload elsewhere.
    st = SentenceTransformer(mote_dir, trust_remote_code=True)
    randomize_experts(st[0].auto_model, seed=3)
    saved = tmp_path / "saved"
    st.save(str(saved))
    assert (saved / "st_mote.py").exists() and (saved / "modeling_mote.py").exists()
    assert not list(saved.glob("*.bin")) and (saved / "model.safetensors").exists()

    out = json.loads(run_isolated(LOAD_AND_ENCODE, str(saved), json.dumps(TEXTS)).splitlines()[-1])

    model = st[0].auto_model.eval()
    tokenizer = st[0].tokenizer
    for task in model.config.tasks:
        batch = tokenizer([model.config.task_prefixes[task] + t for t in TEXTS], padding=True, return_tensors="pt")
        with torch.no_grad():
            expected = model(**batch).last_hidden_state
        assert torch.equal(torch.tensor(out["auto"][task]), expected), task
    assert sorted(out["st"]) == sorted(st.prompts)
    for name, values in out["st"].items():
        expected = st.encode(TEXTS, prompt_name=name, convert_to_tensor=True)
        assert torch.equal(torch.tensor(values), expected), name


def test_save_pretrained_round_trip_in_process(tmp_path):
    from conftest import tiny_mote_config

    model = MoteBertModel(tiny_mote_config()).eval()
    randomize_experts(model)
    model.save_pretrained(tmp_path)
    assert not list(tmp_path.glob("*.bin"))
    again = MoteBertModel.from_pretrained(tmp_path).eval()
    ids = torch.randint(1000, 2000, (2, 7))
    with torch.no_grad():
        # loaded weights keep the file's offsets, so their alignment (and a BLAS kernel's path) may differ
        torch.testing.assert_close(
            model(input_ids=ids, task="clustering").last_hidden_state,
            again(input_ids=ids, task="clustering").last_hidden_state,
            rtol=0,
            atol=1e-6,
        )
    assert again.config.tasks == model.config.tasks and again.config.expert_layers == [1, 3]
