"""Make the folders the client matrix (scripts/test_clients.sh) loads, and the vectors they must give.

    .venv/bin/python scripts/clients/make_folders.py OUT

writes, with this project's own stack (.venv):
    OUT/mote       a MoTE folder (tests/data/tiny-minilm upcycled) whose experts are perturbed so that they differ:
                   a query reaching any other expert than the query expert gives another vector
    OUT/mpnet-mote the same of an MPNet base (tests/data/tiny-mpnet)
    OUT/moe        the token-routed MoE folder (upcycled, experts kept)
    OUT/<name>-onnx  their ONNX exports (`moe-embed export`; the MoTEs' with their int8 graph), for fastembed
                   and transformers.js; OUT/<name>-onnx.reference.json: texts (prefixed and plain) and what
                   sentence-transformers' `encode` gives for them, for scripts/clients/js/check.mjs
    OUT/expected.json  the texts, and per folder what sentence-transformers gives: `encode_query(QUERIES)`,
                   `encode_document(DOCUMENTS)`, plus how far the wrong routes lie (the check is only meaningful
                   when a query sent to the document expert, or to the default expert, is visibly elsewhere)
"""

import json
import os
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

# the MoTE folders, by the tiny dense base (tests/data) each is upcycled from
MOTE_FOLDERS = {"mote": "tiny-minilm", "mpnet-mote": "tiny-mpnet"}
QUERIES = ["how do plants make food", "who wrote the laws of motion", "cats"]
DOCUMENTS = [
    "Photosynthesis converts light, water and carbon dioxide into sugar and oxygen in the leaves of plants.",
    "Isaac Newton formulated the laws of motion.",
    "The quarterly report shows revenue grew by twelve percent compared to last year.",
]


def cli(*args: str) -> None:
    done = subprocess.run([str(Path(sys.executable).parent / "moe-embed"), *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"moe-embed {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")


def max_one_minus_cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float((1 - cos).max())


def min_one_minus_cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float((1 - cos).min())


def main(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from conftest import save_trained_copy
    from sentence_transformers import SentenceTransformer

    from moe_embed.modeling.st_folder import write_portable_module_files

    out.mkdir(parents=True, exist_ok=True)
    data = REPO / "tests" / "data"
    in_process = threading.Lock()

    def make_mote(name: str, base: str) -> None:
        with tempfile.TemporaryDirectory() as work:
            # a name of its own: the folders' code is cached by the folder's name, and the builds run side by side
            untrained = f"{work}/{name}-untrained"
            cli("upcycle", "--base", str(data / base), "--output", untrained)
            with in_process:  # what runs in this process runs one build at a time (the commands are processes)
                save_trained_copy(untrained, out / name, seed=5)  # experts perturbed: a wrong route shows
                # `save` on sentence-transformers 6 names its modules by their 6.x paths; the package's own rewrite
                # keeps the folder loadable on 5.x (Infinity's environment) as the CLI's folders are
                write_portable_module_files(out / name)
        cli("export", str(out / name), "--output", str(out / f"{name}-onnx"), "--quantize", "int8", "--overwrite")

    def make_moe() -> None:
        cli("upcycle", "--base", str(data / "tiny-minilm"), "--arch", "moe", "--output", str(out / "moe"))
        cli("export", str(out / "moe"), "--output", str(out / "moe-onnx"), "--overwrite")

    # two builds at a time (two cores; each step is mostly one thread): the folders do not depend on each other
    with ThreadPoolExecutor(max_workers=2) as pool:
        builds = [pool.submit(make_mote, name, base) for name, base in MOTE_FOLDERS.items()]
        for build in [*builds, pool.submit(make_moe)]:
            build.result()

    expected = {"queries_text": QUERIES, "documents_text": DOCUMENTS, "folders": {}}
    for name in (*MOTE_FOLDERS, "moe"):
        st = SentenceTransformer(str(out / name), trust_remote_code=True)
        texts = [st.prompts.get("query", "") + QUERIES[0], *QUERIES[1:], st.prompts.get("document", "") + DOCUMENTS[0]]
        reference = {"texts": texts, "embeddings": st.encode(texts).tolist()}
        (out / f"{name}-onnx.reference.json").write_text(json.dumps(reference))
        queries = st.encode_query(QUERIES)
        documents = st.encode_document(DOCUMENTS)
        entry = {"queries": queries.tolist(), "documents": documents.tolist()}
        if name in MOTE_FOLDERS:
            # what a query gives at the wrong expert, with the very same tokens ("search_query: " + text):
            # the document expert (task="document"), and the text sent with no prefix (the default expert)
            prompt = st.prompts["query"]
            wrong = {
                "query text at the document expert": st.encode([prompt + q for q in QUERIES], task="document"),
                "query without its prefix (default expert)": st.encode(QUERIES),
                "document text at the query expert": st.encode_query(DOCUMENTS, prompt=st.prompts["document"]),
            }
            right = {
                "query text at the document expert": queries,
                "query without its prefix (default expert)": queries,
                "document text at the query expert": documents,
            }
            entry["wrong_routes"] = {k: min_one_minus_cos(v, right[k]) for k, v in wrong.items()}
        expected["folders"][name] = entry
    (out / "expected.json").write_text(json.dumps(expected))
    print(f"folders in {out}: {', '.join(expected['folders'])} and their -onnx exports; expected.json")
    for name in MOTE_FOLDERS:
        for k, v in expected["folders"][name]["wrong_routes"].items():
            print(f"  {name}: a wrong route ({k}): min 1-cos {v:.2e}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
