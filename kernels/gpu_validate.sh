#!/usr/bin/env bash
# One run on a GPU machine (about 10 minutes on an H100/H200): the GPU tests, compute-sanitizer, and the kernel
# benchmark. Installs nothing: it uses the project's .venv as set up by `make setup` with a CUDA build of torch
# (see README). Results: kernels/results/kernels-<gpu>.json (benchmark) and kernels/results/gpu_validate.log.
# Exit code: 0 if every step passed, 1 otherwise (each step still runs).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p kernels/results
LOG=kernels/results/gpu_validate.log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1

if ! "$PY" -c "import sys, torch; from pipeline.samplers import cupy_backend as c; \
    sys.exit(0 if c.available() else print('gpu_validate.sh:', c.unavailable_reason()) or 2)"; then
    exit 2
fi
"$PY" -c "import torch, cupy; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| cupy', cupy.__version__, \
    '|', torch.cuda.get_device_name())"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true

status=0
step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    echo "== $name (limit ${limit}s)"
    timeout "$limit" "$@"; local rc=$?
    echo "== $name: rc=$rc in $((SECONDS - t0))s"
    [ "$rc" -eq 0 ] || status=1
}

# 1. compile once (fills CuPy's cache; later steps and processes load the cubin)
step "compile" 120 "$PY" -c "import time; t = time.time(); from pipeline.kernels import loader; loader.module(0); \
print(f'compiled/loaded in {time.time() - t:.1f}s')"
# 2. GPU tests: kernel vs reference, and the chi-square exactness tests on the cupy backend
step "gpu tests" 240 "$PY" -m pytest -q -x -p no:cacheprovider tests/test_kernels_gpu.py
step "exactness (cupy)" 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_sampler_exactness.py -k cupy
# 3. compute-sanitizer memcheck / racecheck / synccheck on a small case
step "sanitizer" 150 bash kernels/sanitize.sh
# 4. the benchmark; its JSON is rewritten after every configuration, so a cut-short run keeps what it measured
step "bench kernels" 300 "$PY" -m pipeline bench kernels --repeats 30

echo "gpu_validate.sh: $([ $status -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED') (log: $LOG)"
exit $status
