#!/usr/bin/env bash
# The main job: sets up .venv when needed, then runs the .pte benchmark (extra args pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh
exec .venv/bin/python -m benchmarks "$@"
