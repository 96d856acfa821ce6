#!/usr/bin/env bash
# compute-sanitizer memcheck, racecheck and synccheck over a small verify step (kernels/sanitize_case.py).
# Skips (exit 0) without a GPU or without compute-sanitizer; exit 1 if a tool reports an error.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
SAN=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "sanitize.sh: skipped: torch sees no CUDA GPU"; exit 0
fi
if [ ! -x "$SAN" ]; then
    echo "sanitize.sh: skipped: compute-sanitizer not found (set COMPUTE_SANITIZER=/path/to/compute-sanitizer)"; exit 0
fi
# compile (or load from CuPy's cache) outside the sanitizer, so the checked run only loads the cubin
"$PY" -c "from pipeline.kernels import loader; loader.module(0)"
for tool in memcheck racecheck synccheck; do
    echo "== compute-sanitizer --tool $tool"
    # every kernel of the case is checked (torch's few small ones too: the case is small enough)
    "$SAN" --tool "$tool" --error-exitcode 1 "$PY" kernels/sanitize_case.py
done
echo "sanitize.sh: memcheck, racecheck, synccheck clean"
