#!/usr/bin/env bash
# The device-machine check of issue 20 (the Triton kernels, CUDA graphs and the engine on an
# H200), made to fit one call of the device tool:
#
#   VENV_PYTHON=.venv/bin/python bench/gpu_wheels.sh   # here, once: wheels + tokenizer in .whl/
#   device run:  command "bash bench/gpu_check.sh"   carry [".whl"]   timeout_s 540
#
# On a GPU it installs the carried wheels, then runs, each step cut at its own time limit and
# all under one deadline (GPU_CHECK_SECONDS, 480 s), so a step that hangs cannot take the
# others' time:
#   1. the kernel tests compiled for CUDA (the files CI runs interpreted)       kernel_tests.log
#   2. bench/kernels.py: decode bandwidth as a share of peak, prefill TFLOP/s,
#      torch/SDPA beside each                                                  kernels.md
#   3. bench/gpu_engine.py: random-weight SmolLM2-135M and Llama-1B shapes, engine
#      tok/s with CUDA graphs and eager against HF generate at 1/32/256 seqs, and
#      one sequence's step against its kernels' time                           gpu_engine.md
#   4. the engine tests on CUDA (graphs captured by every engine they start)   engine_tests.log
#   5. the decode launch-shape sweep, with what time is left                   kernels_sweep.md
# plus gpu_check.log (machine, versions, each step's exit status, time and last lines); a
# benchmark's .log stays only when it wrote no table. Files go to $OUT (bench/results/gpu/ when
# $OUT is unset: then, on a GPU, kernels.md with the sweep appended and gpu_engine.md are also
# copied over bench/results/kernels.md and bench/results/gpu_engine.md).
#
# Without CUDA (the proof run here) the CUDA steps are skipped: gpu_engine.py runs its tiny CPU
# configuration and the engine tests run their CPU-side CUDA-graph and input-batch files.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
log="$out/gpu_check.log"
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_SECONDS:-480}))
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
py="${PYTHON:-python3}"

say() { echo "$*" | tee -a "$log"; }

# step NAME SECONDS LOGFILE CMD...: run CMD under min(SECONDS, time to the deadline - 5 s).
step() {
    local name="$1" budget="$2" logfile="$3"
    shift 3
    local left=$((deadline - $(date +%s) - 5))
    ((budget > left)) && budget=$left
    if ((budget < 10)); then
        say "== $name: skipped, $left s left before the deadline"
        return 0
    fi
    local start=$(date +%s)
    timeout --kill-after=5 "$budget" "$@" >"$logfile" 2>&1
    local rc=$?
    say "== $name: exit $rc after $(($(date +%s) - start)) s (limit $budget s; log $(basename "$logfile"))"
    tail -n 3 "$logfile" | sed 's/^/   /' | tee -a "$log"
}

: >"$log"
say "== machine"
if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$log"
fi

cuda=0
"$py" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" && cuda=1

say "== wheels"
export PYTHONPATH="$PWD/src:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}"
if ((!cuda)); then
    say "no CUDA device: the environment here is used as it is"
elif ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -n 5 | tee -a "$log"
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
else
    say "no .whl/ carried: run bench/gpu_wheels.sh here and name .whl in carry"
fi
# The engine tests' tiny model takes this tokenizer (the default model cannot travel).
[[ -f .whl/tokenizer/tokenizer.json ]] && export TRIO_LLM_TEST_TOKENIZER="$PWD/.whl/tokenizer"

"$py" - 2>&1 <<'PY' | tee -a "$log"
import platform, torch
try:
    import triton
    tv = triton.__version__
except ImportError:
    tv = "absent"
dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none (CPU run)"
print("python", platform.python_version(), "torch", torch.__version__, "triton", tv,
      "cuda", torch.version.cuda, "device", dev)
PY

parallel=()
"$py" -c "import xdist" 2>/dev/null && parallel=(-n 4)
pytest_args=(-q -p no:cacheprovider -o addopts="-ra")

if ((cuda)); then
    unset TRITON_INTERPRET
    # Compiling each test's kernels dominates this step: 4 workers when xdist is there.
    step "kernel tests (CUDA)" 90 "$out/kernel_tests.log" \
        "$py" -m pytest tests/kernels "${pytest_args[@]}" "${parallel[@]}"

    step "kernel benchmark" 100 "$out/kernels.log" \
        "$py" bench/kernels.py --device cuda --out "$out/kernels.md"
    [[ -s "$out/kernels.md" ]] && rm -f "$out/kernels.log"

    step "engine benchmark" 200 "$out/gpu_engine.log" \
        "$py" bench/gpu_engine.py --out "$out/gpu_engine.md" ${GPU_ENGINE_ARGS:-}
    [[ -s "$out/gpu_engine.md" ]] && rm -f "$out/gpu_engine.log"

    # Not the tests that need the real default model (it cannot travel) or its embedding
    # sibling, nor the engine-process tests (the rings are CPU code, tested by CI).
    step "engine tests (CUDA)" 120 "$out/engine_tests.log" \
        "$py" -m pytest tests/engine "${pytest_args[@]}" -x \
        --ignore tests/engine/test_pooling.py --ignore tests/engine/test_process.py \
        -k "not default_model"

    step "launch-shape sweep" 100 "$out/kernels_sweep.log" \
        "$py" bench/kernels.py --device cuda --sweep --out "$out/kernels_sweep.md"
    [[ -s "$out/kernels_sweep.md" ]] && rm -f "$out/kernels_sweep.log"

    if [[ -z "${OUT:-}" ]]; then
        [[ -s "$out/kernels.md" ]] && cp "$out/kernels.md" bench/results/kernels.md &&
            [[ -s "$out/kernels_sweep.md" ]] && cat "$out/kernels_sweep.md" >>bench/results/kernels.md
        [[ -s "$out/gpu_engine.md" ]] && cp "$out/gpu_engine.md" bench/results/gpu_engine.md
    fi
else
    say "== no CUDA device: the kernel tests, kernel benchmark and sweep are skipped"
    export TRITON_INTERPRET=1
    step "engine benchmark (CPU, tiny)" 200 "$out/gpu_engine.log" \
        "$py" bench/gpu_engine.py --out "$out/gpu_engine.md" ${GPU_ENGINE_ARGS:-}
    [[ -s "$out/gpu_engine.md" ]] && rm -f "$out/gpu_engine.log"
    step "engine tests (CPU side of graphs, input batch)" 120 "$out/engine_tests.log" \
        "$py" -m pytest "${pytest_args[@]}" -x \
        tests/engine/test_cuda_graphs.py tests/engine/test_input_batch.py
fi
say "== done in $(($(date +%s) - started)) s, $((deadline - $(date +%s))) s before the deadline"
