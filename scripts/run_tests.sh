#!/usr/bin/env bash
# The test suite: sets up .venv when needed, then runs pytest on two workers, one test file per
# worker at a time. The default tier leaves out the tests marked `slow`; `-m slow` runs only
# those (CI runs both). Extra args pass through (add `-n 0` to run in one process).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile -m "not slow" "$@"
