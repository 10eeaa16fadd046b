#!/usr/bin/env bash
# The test suite: sets up .venv when needed, then runs pytest on two workers, one test file per
# worker at a time (extra args pass through; add `-n 0` to run in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile "$@"
