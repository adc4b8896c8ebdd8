#!/usr/bin/env bash
# Set up .venv, upcycle the bundled all-MiniLM-L6-v2 into a MoTE model (models/demo/mote-minilm), load it
# back with AutoModel and SentenceTransformer, and print per-task embeddings and their similarities.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
.venv/bin/moe-embed upcycle --output models/demo/mote-minilm --overwrite  # its own folder: the README's commands write models/mote-minilm
.venv/bin/python examples/quickstart.py models/demo/mote-minilm
