#!/usr/bin/env bash
# Set up .venv and run the test suite (offline, CPU). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
.venv/bin/python -m pytest "$@"
