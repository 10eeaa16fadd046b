#!/usr/bin/env bash
# The test suite: sets up .venv when needed, then runs pytest (extra args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest -q "$@"
