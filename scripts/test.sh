#!/usr/bin/env bash
# Set up .venv and run the whole test suite, slow tests included (the full lane; offline, CPU), on two pytest-xdist
# workers; tests that share a local Ray or the exported folders stay on one worker (tests/conftest.py). Extra
# arguments go to pytest (`-n 0`: one process). `pytest` alone is the contributor's lane (docs/development.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1
.venv/bin/python -m pytest -m "" -n 2 --dist loadgroup "$@"
