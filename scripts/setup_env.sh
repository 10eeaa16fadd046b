#!/usr/bin/env bash
# Creates .venv (when missing or stale) and installs the project with its test, benchmark and QNN extras.
# Idempotent: a second run with an unchanged pyproject.toml does nothing.
# Where the QNN extra (onnxruntime-qnn, x86-64 Linux) cannot install, the rest is installed and the
# benchmark's QNN rows say "skipped: <why>". Once installed, the QNN libraries are linked into
# their folder now (one line names it; ET_CONSTANT_FOLDING_QNN_DIR moves it), not at first use.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
    echo "setup: installing the project into .venv (torch, executorch, the test, benchmark and QNN extras; first run only)" >&2
    [ -x .venv/bin/python ] || "$PY" -m venv .venv
    .venv/bin/python -m pip install --quiet --upgrade pip
    if ! .venv/bin/python -m pip install --quiet -e ".[test,benchmarks,qnn]"; then
        echo "setup: the qnn extra (onnxruntime-qnn==2.5.0) did not install; installing without it (QNN rows will be skipped)" >&2
        .venv/bin/python -m pip install --quiet -e ".[test,benchmarks]"
    fi
    .venv/bin/python -c "import sys, qnn.sdk; sys.exit(qnn.sdk.main())" \
        || echo "setup: no usable QNN libraries here; the benchmark's QNN rows will say 'skipped: <why>'" >&2
    rm -f .venv/.installed-*
    touch "$stamp"
fi
