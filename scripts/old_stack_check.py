"""Load-and-compare across library versions: folders written on this project's stack must give the same
embeddings on the oldest supported one (transformers 4.57, sentence-transformers 5.1).

    .venv/bin/python scripts/old_stack_check.py make DIR            # new stack: folders + expected outputs
    .venv-oldstack/bin/python scripts/old_stack_check.py check DIR  # old stack: load them, compare

`make` upcycles the bundled MiniLM, and the tests' tiny MPNet and ModernBERT, to MoTE (experts perturbed, so that
routing shows), to the token-routed MoE (expert noise) and to CoMoE (LoRA B perturbed), saves the MiniLM MoTE
folder again through sentence-transformers 6 as training does (made portable as training makes it), and saves
every case's output in `DIR/expected.json`.
`check` runs where this repository is not importable (the folders carry their code), computes the same
cases and exits 1 when any differs by more than 1e-5. `make` also exports the MoTE folders to ONNX (`*-onnx`),
which `check` loads with sentence-transformers' ONNX backend and optimum's `ORTModelForFeatureExtraction`
(optimum-onnx requires transformers < 4.58, so only this stack has them), within 1e-4 of `encode` on the new
stack. `scripts/test_old_stack.sh` runs both.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# folder -> model family; `mote-resaved` is the MoTE folder saved again by sentence-transformers 6, as
# training saves its output, then made portable by `moe_embed.modeling.st_folder.write_portable_module_files`
FOLDERS = {"mote": "mote", "moe": "moe", "comoe": "comoe", "mote-resaved": "mote"}
# the bases beyond BERT that transformers 4.57 has, upcycled from the tiny folders of the tests
BASES = {"mpnet": "tests/data/tiny-mpnet", "modernbert": "tests/data/tiny-modernbert"}
FOLDERS.update({f"{base}-{family}": family for base in BASES for family in ("mote", "moe", "comoe")})
# the exported folders the old stack's ONNX loaders read (sentence-transformers' backend, optimum)
ONNX_FOLDERS = ("mote-onnx", "mpnet-mote-onnx", "modernbert-mote-onnx")
TEXTS = ["who was isaac newton?", "Stocks fell sharply on Wall Street today after the announcement."]
# MoTE and CoMoE are bit-identical; the MoE differs in the last bits because transformers 5 runs its experts
# with `grouped_mm` by default and 4.x, which has no experts backends, with the eager loop.
TOLERANCE = 1e-5
# an ONNX graph against PyTorch (the export's own check allows 1e-4)
ONNX_TOLERANCE = 1e-4
ONNX_TEXTS = ["search_query: " + TEXTS[0], "Clustering: " + TEXTS[1], TEXTS[1]]


def onnx_cases(folder: Path) -> dict[str, list]:
    """An exported folder through the loaders that read it as a Hugging Face folder: sentence-transformers'
    ONNX backend and optimum (mean pooling and normalisation, as the folder's modules say)."""
    import torch
    from optimum.onnxruntime import ORTModelForFeatureExtraction
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    st = SentenceTransformer(str(folder), backend="onnx", model_kwargs={"file_name": "onnx/model.onnx"})
    model = ORTModelForFeatureExtraction.from_pretrained(str(folder), subfolder="onnx", file_name="model.onnx")
    batch = AutoTokenizer.from_pretrained(str(folder))(ONNX_TEXTS, padding=True, return_tensors="pt")
    mask = batch["attention_mask"].unsqueeze(-1).float()
    hidden = model(**batch).last_hidden_state
    pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
    cls = pooling.get("pooling_mode_cls_token") or pooling.get("pooling_mode") == "cls"  # 5.x's form, 6.x's
    pooled = hidden[:, 0] if cls else (hidden * mask).sum(1) / mask.sum(1)
    optimum = torch.nn.functional.normalize(pooled, dim=-1)
    return {"sentence-transformers backend=onnx": st.encode(ONNX_TEXTS).tolist(), "optimum": optimum.tolist()}


def cases(folder: Path, family: str) -> dict[str, list]:
    """Every output a user reads, computed with whatever transformers / sentence-transformers are installed."""
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    # Sentence-Transformers first: it loads the folder's module file into an empty module cache, as a user's
    # first load does (an AutoModel load before it would fill the cache with the model's files)
    st = SentenceTransformer(str(folder), trust_remote_code=True, device="cpu")
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=True)
    model = AutoModel.from_pretrained(str(folder), trust_remote_code=True).eval()
    prefixed = ["search_query: " + TEXTS[0], "clustering: " + TEXTS[1]] if family == "mote" else TEXTS
    with torch.no_grad():
        hidden = model(**tokenizer(prefixed, padding=True, return_tensors="pt")).last_hidden_state
    out = {"automodel": hidden.tolist(), "encode": st.encode(TEXTS).tolist()}
    if family == "mote":
        out["task=clustering"] = st.encode(TEXTS, task="clustering").tolist()
        out["encode_query"] = st.encode_query(TEXTS).tolist()
        out["encode_document"] = st.encode_document(TEXTS).tolist()
        out["prompt_name=query"] = st.encode(TEXTS, prompt_name="query").tolist()
        out["pre-prefixed"] = st.encode(prefixed).tolist()
    return out


def make(out: Path) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    from moe_embed.convert.options import upcycle_options
    from moe_embed.convert.upcycle import upcycle

    repo = Path(__file__).resolve().parent.parent
    for prefix, base in [("", None), *((f"{name}-", str(repo / path)) for name, path in BASES.items())]:
        upcycle(upcycle_options(base=base, output=out / f"{prefix}mote"))
        upcycle(upcycle_options(base=base, output=out / f"{prefix}moe", arch="moe", expert_noise=0.02))
        upcycle(upcycle_options(base=base, output=out / f"{prefix}comoe", arch="comoe"))
    generator = torch.Generator().manual_seed(0)
    perturbed = [name for name, family in FOLDERS.items() if family in ("mote", "comoe") and "resaved" not in name]
    for name in perturbed:  # make the experts differ, as training would, in the converter's folder
        path = out / name / "model.safetensors"
        state = load_file(str(path))
        for name, tensor in state.items():
            if ".experts." in name or "lora_B" in name:
                state[name] = tensor + torch.randn(tensor.shape, generator=generator) * 0.02
        save_file(state, str(path), metadata={"format": "pt"})
    from sentence_transformers import SentenceTransformer

    from moe_embed.modeling.st_folder import write_portable_module_files

    SentenceTransformer(str(out / "mote"), trust_remote_code=True).save(str(out / "mote-resaved"))
    write_portable_module_files(out / "mote-resaved")
    expected = {name: cases(out / name, family) for name, family in FOLDERS.items()}
    from moe_embed.convert.export_onnx import ExportOptions, export_onnx

    for name in ONNX_FOLDERS:
        source = out / name.removesuffix("-onnx")
        export_onnx(ExportOptions(model_dir=source, output=out / name))
        reference = SentenceTransformer(str(source), trust_remote_code=True).encode(ONNX_TEXTS).tolist()
        expected[name] = {case: reference for case in ("sentence-transformers backend=onnx", "optimum")}
    (out / "expected.json").write_text(json.dumps(expected))


def check(out: Path) -> int:
    import sentence_transformers
    import torch
    import transformers

    expected = json.loads((out / "expected.json").read_text())
    print(
        f"transformers {transformers.__version__}, sentence-transformers {sentence_transformers.__version__}, "
        f"torch {torch.__version__}"
    )
    failed = False
    for name, outputs in expected.items():
        onnx = name in ONNX_FOLDERS
        got = onnx_cases(out / name) if onnx else cases(out / name, FOLDERS[name])
        tolerance = ONNX_TOLERANCE if onnx else TOLERANCE
        for case, values in outputs.items():
            diff = (torch.tensor(got[case]) - torch.tensor(values)).abs().max().item()
            failed |= not diff <= tolerance
            print(f"{name:12} {case:34} max |old - new| = {diff:.2e} (tolerance {tolerance:g})")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("make", "check"):
        sys.exit(f"usage: {sys.argv[0]} make|check DIR")
    folder = Path(sys.argv[2])
    if sys.argv[1] == "make":
        make(folder)
    else:
        sys.exit(check(folder))
