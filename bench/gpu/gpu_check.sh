#!/usr/bin/env bash
# The device-machine check of issues 20 and 44 (the Triton kernels, CUDA graphs, the engine's
# paths on an H200), made to fit one call of the device tool:
#
#   VENV_PYTHON=.venv/bin/python bench/gpu/gpu_wheels.sh   # here, once: wheels + tokenizer in .whl/
#   device run:  command "bash bench/gpu/gpu_check.sh"   carry [".whl"]   timeout_s 480
#   (with $OUT set, as on the device, its files come back in one gpu_check.tar.gz)
#
# On a GPU it installs the carried wheels, then runs, each step cut at its own time limit and
# all under one deadline (GPU_CHECK_SECONDS, 450 s), so a step that hangs cannot take the
# others' time; GPU_CHECK_STEPS (e.g. "paths survey") runs only the steps named, for a rerun:
#   kernels   the kernel tests compiled for CUDA (the files CI runs interpreted) kernel_tests.log
#   bench     bench/gpu/attention_kernels.py: decode bandwidth as a share of peak,
#             prefill TFLOP/s, torch/SDPA beside each                        attention_kernels.md
#   engine    bench/gpu/gpu_engine.py: random-weight SmolLM2-135M and Llama-1B shapes, engine
#             tok/s with CUDA graphs and eager against HF generate at 1/32/256 seqs, and
#             one sequence's step against its kernels' time                  gpu_engine.md
#   paths     bench/gpu/gpu_paths.py: the quantized weights (as a user starts them, and forced
#             past the CPU gate), the quantized ops, batch invariance         gpu_paths.md
#   survey    bench/model_types/survey.py on CUDA: the generic path (transformers' modules,
#             paged attention) against transformers' generate, 16 families   architectures.md
#   tests     the engine tests on CUDA (graphs captured by every engine they start)
#                                                                            engine_tests.log
#   sweep     the decode launch-shape sweep, with what time is left          attention_sweep.md
# plus gpu_check.log (machine, versions, each step's exit status, time and last lines); a
# benchmark's .log stays only when it wrote no table. Files go to $OUT (bench/results/gpu/ when
# $OUT is unset).
#
# Without CUDA (the proof run here) the CUDA steps are skipped: gpu_engine.py and gpu_paths.py
# run their tiny CPU configurations, the survey two families, and the engine tests their
# CPU-side CUDA-graph and input-batch files.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."  # the repository
out="${OUT:-bench/results/gpu}"
mkdir -p "$out"
log="$out/gpu_check.log"
started=$(date +%s)
deadline=$((started + ${GPU_CHECK_SECONDS:-450}))
steps=" ${GPU_CHECK_STEPS:-kernels bench engine paths survey tests sweep} "
# USE_HUB_KERNELS=NO: transformers (with the `kernels` package it now requires) would fetch
# CUDA kernels from the hub for its own layers; the device reaches no network, and HF generate
# is measured as transformers computes by itself.
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1 USE_HUB_KERNELS=NO
py="${PYTHON:-python3}"

say() { echo "$*" | tee -a "$log"; }

# step NAME SECONDS LOGFILE CMD...: run CMD under min(SECONDS, time to the deadline - 5 s).
step() {
    local name="$1" budget="$2" logfile="$3"
    shift 3
    if [[ "$steps" != *" ${name%% *} "* ]]; then
        return 0
    fi
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
# src/ for trio_llm (no editable install on the device); each bench script finds bench/ itself.
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
if ((!cuda)); then
    say "no CUDA device: the environment here is used as it is"
elif ls .whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl 2>&1 | tail -n 5 | tee -a "$log"
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
else
    say "no .whl/ carried: run bench/gpu/gpu_wheels.sh here and name .whl in carry"
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
"$py" -c "import xdist" 2>/dev/null && parallel=(-n 8)
pytest_args=(-q -p no:cacheprovider -o addopts="-ra")

# Families whose tiny models took the generic path on the CPU (bench/results/architectures.md),
# with the own forward's Llama and Qwen2 beside them.
families=llama,qwen2,qwen3,mistral,gemma2,gemma3_text,phi3,granite,mixtral,qwen3_moe,starcoder2
families=$families,opt,phi,lfm2,olmo2,gemma

if ((cuda)); then
    unset TRITON_INTERPRET
    # Compiling each test's kernels dominates this step: workers when xdist is there.
    step "kernels (tests, CUDA)" 50 "$out/kernel_tests.log" \
        "$py" -m pytest tests/kernels "${pytest_args[@]}" "${parallel[@]}"

    step "bench (attention kernels)" 90 "$out/attention_kernels.log" \
        "$py" bench/gpu/attention_kernels.py --device cuda --out "$out/attention_kernels.md"
    [[ -s "$out/attention_kernels.md" ]] && rm -f "$out/attention_kernels.log"

    step "engine (benchmark)" 110 "$out/gpu_engine.log" \
        "$py" bench/gpu/gpu_engine.py --out "$out/gpu_engine.md" ${GPU_ENGINE_ARGS:---output 64}
    [[ -s "$out/gpu_engine.md" ]] && rm -f "$out/gpu_engine.log"

    step "paths (quantized, invariance)" 45 "$out/gpu_paths.log" \
        "$py" bench/gpu/gpu_paths.py --out "$out/gpu_paths.md"
    [[ -s "$out/gpu_paths.md" ]] && rm -f "$out/gpu_paths.log"

    step "survey (generic path)" 45 "$out/architectures.log" \
        "$py" bench/model_types/survey.py --only "$families" --out "$out/architectures.md"
    [[ -s "$out/architectures.md" ]] && rm -f "$out/architectures.log"

    # Not the tests that need the real default model (it cannot travel) or its embedding
    # sibling, nor the engine-process tests (the rings are CPU code, tested by CI), nor speech
    # (its engine is CTranslate2's, on the CPU).
    step "tests (engine, CUDA)" 70 "$out/engine_tests.log" \
        "$py" -m pytest tests/engine "${pytest_args[@]}" "${parallel[@]}" --timeout 60 \
        --ignore tests/engine/test_pooling.py --ignore tests/engine/test_process.py \
        --ignore tests/engine/test_speech_engine.py --ignore tests/engine/test_quant_quality.py \
        -k "not default_model"

    step "sweep (decode launch shapes)" 60 "$out/attention_sweep.log" \
        "$py" bench/gpu/attention_kernels.py --device cuda --sweep --out "$out/attention_sweep.md"
    [[ -s "$out/attention_sweep.md" ]] && rm -f "$out/attention_sweep.log"
else
    say "== no CUDA device: the kernel tests, kernel benchmark and sweep are skipped"
    export TRITON_INTERPRET=1
    step "engine (benchmark, CPU, tiny)" 200 "$out/gpu_engine.log" \
        "$py" bench/gpu/gpu_engine.py --out "$out/gpu_engine.md" ${GPU_ENGINE_ARGS:-}
    [[ -s "$out/gpu_engine.md" ]] && rm -f "$out/gpu_engine.log"
    step "paths (CPU, tiny)" 100 "$out/gpu_paths.log" \
        "$py" bench/gpu/gpu_paths.py --out "$out/gpu_paths.md"
    [[ -s "$out/gpu_paths.md" ]] && rm -f "$out/gpu_paths.log"
    step "survey (CPU, two families)" 100 "$out/architectures.log" \
        "$py" bench/model_types/survey.py --only llama,gemma2 --out "$out/architectures.md"
    [[ -s "$out/architectures.md" ]] && rm -f "$out/architectures.log"
    step "tests (CPU side of graphs, input batch)" 120 "$out/engine_tests.log" \
        "$py" -m pytest "${pytest_args[@]}" -x \
        tests/engine/test_cuda_graphs.py tests/engine/test_input_batch.py
fi
say "== done in $(($(date +%s) - started)) s, $((deadline - $(date +%s))) s before the deadline"
# The device tool brings back at most 8 files: with $OUT set, everything travels in one archive
# beside the summary log.
if [[ -n "${OUT:-}" ]]; then
    tar -czf /tmp/gpu_check.tar.gz -C "$out" . && find "$out" -type f ! -name gpu_check.log -delete &&
        mv /tmp/gpu_check.tar.gz "$out/"
fi
