#!/usr/bin/env bash
# Everything that needs a CUDA GPU, in one script: the GPU tests, compute-sanitizer, the kernel benchmark, the host
# cost of one eager verify call and the engine benchmark. Installs nothing.
#
#   bash kernels/gpu_validate.sh [STEP ...]      (default: every step; 514 s on an H200, 2026-11-28)
#
# Steps, in order:
#   compile    compile the CUDA kernels once (fills CuPy's cache; later steps and processes load the cubin)
#   tests      GPU tests: kernels vs the torch reference (the chain kernels and tree_verify, the token-tree kernel),
#              chi-square exactness on the cupy backend; the engine,
#              the hf engine, `specsweep run` and Whisper on CUDA (lossless decoding, rollback, sampling,
#              CUDA-event phase times, one host sync per step; the multi-GPU test skips on one GPU)
#   sanitizer  compute-sanitizer memcheck / racecheck / synccheck on a small verify step
#   kernels    `specsweep bench kernels` (the chain kernels, and tree_verify on trees 2,2,1 and 3,2,1)
#              -> kernels/results/kernels-<gpu>.json
#   host       `specsweep bench host --device cuda`: the host side of one eager call of each kernel sampler through
#              the real launcher -> results/bench/host-cuda.json
#   forward    one forward of the Qwen2.5-Coder 1.5B and 0.5B shapes (random weights from kernels/shapes/*/config.json),
#              bfloat16, our static forward eager and compiled under CUDA graphs against transformers' at 1 and 7 new
#              tokens (a one-token step, a γ = 6 verify) -> results/bench/forward-<shape>-cuda.json
#   shapes     `specsweep run` at the Qwen pair's shapes, bfloat16, 128 new tokens: γ = 6 with synthetic acceptance at the
#              real pair's rate (its published iid_alpha), compiled under CUDA graphs and eager, each paired with its
#              own target alone; transformers' generate alone; --verify-graphs on with the cupy exact sampler
#              -> results/bench/shapes-cuda/*.json
#   engine     `specsweep bench engine --device cuda` -> results/bench/engine-cuda.json
# A machine that limits one command's time can run it in two parts, e.g. `compile tests sanitizer`, then
# `host kernels forward shapes engine`.
#
# Python: $PYTHON, else .venv/bin/python, else python3; it needs torch with CUDA, cupy, transformers, accelerate,
# pytest and specsweep itself installed (`make setup` after installing a CUDA torch, see README; or
# `pip install --no-deps --no-build-isolation -e .` into an environment that already has the others: an editable
# install, because kernels/ is imported as pipeline.kernels and the checkout's pipeline/ comes first on the path).
# Log: kernels/results/gpu_validate-<steps>.log. Exit code: 0 if every step passed, 1 otherwise (each step still
# runs), 2 if the GPU backend is unavailable.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ -n "${PYTHON:-}" ]; then PY=$PYTHON; elif [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
export PYTHON=$PY  # kernels/sanitize.sh uses the same interpreter
ALL="compile tests sanitizer kernels host forward shapes engine"
STEPS=${*:-$ALL}
for s in $STEPS; do
    case " $ALL " in *" $s "*) ;; *) echo "gpu_validate.sh: unknown step '$s': choose from: $ALL"; exit 2 ;; esac
done
if ! "$PY" -c "import pipeline.kernels" 2>/dev/null; then
    echo "gpu_validate.sh: specsweep is not installed for $PY (pipeline.kernels is not importable): run" \
         "'make setup', or '$PY -m pip install --no-deps --no-build-isolation -e .' where its requirements are"
    exit 2
fi
if ! "$PY" -c "import sys, torch; from pipeline.samplers import cupy_backend as c; \
    sys.exit(0 if c.available() else print('gpu_validate.sh:', c.unavailable_reason()) or 2)"; then
    exit 2
fi
mkdir -p kernels/results results/bench
LOG=kernels/results/gpu_validate-$(echo "$STEPS" | tr ' ' '-').log
: > "$LOG"
exec > >(tee -a "$LOG") 2>&1
"$PY" -c "import torch, cupy, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, '| cupy', \
    cupy.__version__, '| transformers', transformers.__version__, '|', torch.cuda.get_device_name(), \
    '| GPUs:', torch.cuda.device_count())"
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
want() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }

if want compile; then
    step "compile" 120 "$PY" -c "import time; t = time.time(); from pipeline.kernels import loader; loader.module(0); \
print(f'compiled/loaded in {time.time() - t:.1f}s')"
fi
if want tests; then
    step "gpu tests" 300 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_kernels_gpu.py tests/test_engine.py \
        tests/test_run_cli.py tests/test_whisper.py tests/test_compiled_forward.py
    step "exactness (cupy)" 150 "$PY" -m pytest -q -p no:cacheprovider tests/test_sampler_exactness.py -k cupy
fi
if want sanitizer; then
    step "sanitizer" 150 bash kernels/sanitize.sh
fi
# the benchmarks rewrite their JSON as they go (kernels: after every configuration), so a cut-short run keeps
# what it measured
if want kernels; then
    step "bench kernels" 300 "$PY" -m pipeline bench kernels --repeats 30
fi
if want host; then
    step "bench host" 120 "$PY" -m pipeline bench host --device cuda
fi
QWEN=kernels/shapes/qwen2.5-coder-1.5b-shape
QWEN_DRAFT=kernels/shapes/qwen2.5-coder-0.5b-shape
if want forward; then
    for shape in $QWEN $QWEN_DRAFT; do
        name=$(basename "$shape")
        step "bench forward $name" 240 "$PY" -m pipeline.benchmarks.forward --model "$shape" --device cuda \
            --dtypes bfloat16 --new-tokens 1,7 --ways transformers,static,compiled \
            --out "results/bench/forward-$name-cuda.json"
    done
fi
if want shapes; then
    # the real pair's acceptance: the int4 draft at γ = 6 on 24 CNN/DailyMail articles (its i.i.d. per-position rate)
    ALPHA=$("$PY" -c "import json; print(round(json.load(open('results/published/pair/summary.json'))['runs']\
['qwen-model-kall-int4-g6-bfloat16-128-a24']['metrics']['iid_alpha'], 4))")
    DIR=results/bench/shapes-cuda
    mkdir -p "$DIR"
    "$PY" -c "import json, random; from pipeline.synthetic import WORDS; r = random.Random(0); \
print(''.join(json.dumps({'id': f'p{i}', 'prompt': ' '.join(r.choices(WORDS, k=400))}) + '\n' for i in range(4)), end='')" \
        > "$DIR/prompts.jsonl"
    run_shapes() {  # run_shapes NAME ARGS...: the Qwen shapes on the prompts, 128 new tokens, bfloat16
        local name=$1; shift
        step "shapes $name" 200 "$PY" -m pipeline run --target $QWEN --draft $QWEN_DRAFT --task prompts \
            --data "$DIR/prompts.jsonl" --device cuda --dtype bfloat16 --max-new-tokens 128 --ignore-eos --repeats 3 \
            --no-progress --out "$DIR/$name.json" "$@"
    }
    echo "synthetic acceptance: $ALPHA per position (the Qwen pair's int4 draft at γ = 6)"
    run_shapes synthetic-compiled --gamma 6 --sampler synthetic --synthetic-acceptance "$ALPHA" --temperature 0 \
        --compile reduce-overhead
    run_shapes synthetic-eager --gamma 6 --sampler synthetic --synthetic-acceptance "$ALPHA" --temperature 0
    run_shapes hf-alone --gamma 0 --engine hf --temperature 0
    run_shapes verify-graphs --gamma 6 --sampler exact --backend cupy --temperature 1 --verify-graphs on
fi
if want engine; then
    step "bench engine" 420 "$PY" -m pipeline bench engine --device cuda --repeats 4
fi

echo "gpu_validate.sh [$STEPS]: $([ $status -eq 0 ] && echo 'all steps passed' || echo 'SOME STEPS FAILED') (log: $LOG)"
exit $status
