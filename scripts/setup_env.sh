#!/usr/bin/env bash
# Create .venv (if missing) and install the project with its dev, train, analysis, onnx and openvino extras.
# torch is installed first and pinned to 2.13.0 (a CPU wheel on this machine's disk): an unpinned
# request would pull a multi-GB CUDA build. Set MOE_EMBED_TORCH to install another torch spec.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet "${MOE_EMBED_TORCH:-torch==2.13.0}"
.venv/bin/python -m pip install --quiet -e ".[dev,train,analysis,onnx,openvino,ray]"
# fastembed, a serving client the ONNX export is tested against, in a venv of its own: it pins
# huggingface-hub below 2, which transformers 5 does not accept beside it (tests/test_serving_clients.py)
if [ ! -x .venv-fastembed/bin/python ]; then
  "$PYTHON" -m venv .venv-fastembed
fi
.venv-fastembed/bin/python -m pip install --quiet "fastembed==0.9.1"
