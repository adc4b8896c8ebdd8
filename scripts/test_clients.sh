#!/usr/bin/env bash
# The client matrix of docs/clients.md: build the clients' environments (.venv-clients: LangChain, LlamaIndex,
# Chroma, txtai, Haystack, fastembed, mteb; .venv-clients-infinity: Infinity, whose pins conflict with the
# others), make MoTE folders whose experts differ (a BERT and an MPNet base), a token-routed MoE folder and their ONNX exports with this
# project's .venv (scripts/clients/make_folders.py), then run every client snippet of docs/clients.md in its
# environment, from outside the repository (scripts/clients/check_clients.py): queries must reach the query
# expert and documents the document expert, as sentence-transformers' encode_query / encode_document do; and
# transformers.js (npm, in Node) on the exported folders (scripts/clients/js/check.mjs).
# Needs .venv (scripts/setup_env.sh); pip's cache makes later runs offline. Prints one line per client.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$SECONDS
PYTHON=${PYTHON:-python3}
TORCH=${MOE_EMBED_TORCH:-torch==2.13.0}

# The environments are built once per version of this script (its pins) in a cache outside the repository
# ($MOE_EMBED_VENV_CACHE, default ~/.cache/moe-embed), as CI systems cache them, and linked as .venv-clients*: a
# fresh clone reuses them instead of installing ~2 GB again; a change of pins (the install lines) builds new ones.
cache=${MOE_EMBED_VENV_CACHE:-$HOME/.cache/moe-embed}
key=$(grep -E "pip install|^TORCH=" "$repo/scripts/test_clients.sh" | sha256sum | cut -c1-12)  # the pins alone
venv() {  # venv NAME: create it if missing, torch first (a CPU wheel; unpinned it would pull a CUDA build)
  if [ ! -x "$cache/$1-$key/bin/python" ]; then
    mkdir -p "$cache"
    "$PYTHON" -m venv "$cache/$1-$key"
  fi
  ln -sfn "$cache/$1-$key" "$1"
  "$1/bin/python" -m pip install --quiet "$TORCH"
}

venv .venv-clients
.venv-clients/bin/python -m pip install --quiet "sentence-transformers==6.2.0" "transformers==5.24.0" \
  "langchain-huggingface==1.2.3" "llama-index-embeddings-huggingface==0.8.0" "llama-index-core==0.14.25" \
  "chromadb==1.5.9" "txtai==9.14.0" "haystack-ai==3.4.1" "sentence-transformers-haystack==2.0.0" \
  "fastembed==0.9.1" "mteb==2.26.24"

# infinity-emb 0.0.78 pins sentence-transformers<4 (3.4.1, which the folders' code refuses: it needs >=5.1) and
# breaks on transformers 5 (it calls the tokenizer's batch_encode_plus): installed without its pins beside
# sentence-transformers 5.7 and transformers 4.57 (docs/clients.md, Infinity)
venv .venv-clients-infinity
.venv-clients-infinity/bin/python -m pip install --quiet "transformers==4.57.6" "sentence-transformers==5.7.0" \
  "huggingface-hub==0.36.2" "numpy==1.26.4" "requests==2.34.2"
.venv-clients-infinity/bin/python -m pip install --quiet --no-deps "infinity-emb==0.0.78"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# offline, the folders' code in a module cache of this run (two folders named mote must not share one), no telemetry
export HF_HUB_OFFLINE=1 HF_MODULES_CACHE="$work/modules" ANONYMIZED_TELEMETRY=False DO_NOT_TRACK=1
.venv/bin/python scripts/clients/make_folders.py "$work/folders"

status=0
# transformers.js in Node on the exported folders (onnxruntime-node's post-install would fetch CUDA files from a host
# this machine cannot reach; its CPU binaries ship in the npm package)
(cd scripts/clients/js && ONNXRUNTIME_NODE_INSTALL=skip ONNXRUNTIME_NODE_INSTALL_CUDA=skip \
  npm install --no-audit --no-fund --loglevel=error)
for name in mote mpnet-mote; do
  node scripts/clients/js/check.mjs "$work/folders/$name-onnx" "$work/folders/$name-onnx.reference.json" \
    --int8-file onnx/model_qint8_avx512_vnni.onnx || status=1
done
node scripts/clients/js/check.mjs "$work/folders/moe-onnx" "$work/folders/moe-onnx.reference.json" || status=1
# run from outside the repository, so that only the code inside the folders can be imported; two groups of clients
# side by side (two cores; a client is mostly one thread), each in a folder and a module cache of its own, their
# lines printed in order after
clients() {  # clients GROUP VENV NAMES
  mkdir "$work/run-$1"
  (cd "$work/run-$1" && HF_MODULES_CACHE="$work/modules-$1" "$repo/$2/bin/python" "$repo/scripts/clients/check_clients.py" \
    "$work/folders" --clients "$3") > "$work/clients-$1.txt" 2>&1
}
clients a .venv-clients langchain,llamaindex,chromadb,txtai & first=$!
{ rc=0; clients b .venv-clients haystack,fastembed,mteb || rc=1; clients c .venv-clients-infinity infinity || rc=1
  exit "$rc"; } & second=$!
wait "$first" || status=1
wait "$second" || status=1
cat "$work"/clients-a.txt "$work"/clients-b.txt "$work"/clients-c.txt 2>/dev/null || true
echo "client matrix $([ "$status" = 0 ] && echo passed || echo FAILED) in $((SECONDS - start)) s"
exit "$status"
