#!/usr/bin/env bash
# Build the oldest supported stack (transformers 4.57, sentence-transformers 5.1, optimum-onnx) in .venv-oldstack and check
# that folders written on this project's stack (.venv) load there with the same embeddings
# (scripts/old_stack_check.py). Needs .venv (scripts/setup_env.sh); pip's cache makes later runs offline.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
PYTHON=${PYTHON:-python3}
if [ ! -x .venv-oldstack/bin/python ]; then
  "$PYTHON" -m venv .venv-oldstack
fi
.venv-oldstack/bin/python -m pip install --quiet "${MOE_EMBED_TORCH:-torch==2.13.0}"
# optimum-onnx (sentence-transformers' ONNX backend) requires transformers < 4.58: it is checked here only
.venv-oldstack/bin/python -m pip install --quiet "transformers==4.57.*" "sentence-transformers==5.1.*" \
  "huggingface-hub<1.0" "accelerate<2" safetensors "optimum==2.1.0" "optimum-onnx==0.1.0" onnxruntime
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export HF_HUB_OFFLINE=1 HF_MODULES_CACHE="$work/modules"
.venv/bin/python scripts/old_stack_check.py make "$work/folders"
# run from outside the repository, so that only the code inside the folders can be imported
(cd "$work" && "$OLDPWD/.venv-oldstack/bin/python" "$OLDPWD/scripts/old_stack_check.py" check "$work/folders")
echo "old-stack check done in $((SECONDS - start)) s"
