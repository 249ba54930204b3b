#!/usr/bin/env bash
# trio-llm (default flags) and vLLM's CPU build served in turn, ROUNDS times (A B A B ...), then
# the llama-cpp-python server once, each loaded by bench/serving/serve.py's closed loop at c=1,
# 8 and 32 (streaming chat, 64 output tokens, compare.py's prompt settings). compare.py runs each
# server once, one after the other; on these shared VMs the machine's speed drifts by a third
# within an hour (the same server measured 15 and 22 ms ITL an hour apart), so a ratio is only
# worth quoting from rounds that alternate. Prints one line per server, round and level; the
# JSON of every level goes to $OUT (default /tmp/interleaved), one file per server and round.
#
# Usage: bash bench/serving/interleaved.sh [ROUNDS]     (peers from bench/serving/setup_peers.sh
#        and ../shared/peers/vllm_cpu_setup.sh, in $PEERS, default ../peers; TRIO_ALT_ENV="N=v"
#        adds trio-llm under that environment to each round, TRIO_ALT_ARGS="flags" with those
#        flags too; LOAD="serve.py flags" replaces the
#        load, e.g. the long-context row: LOAD="--concurrency 8 --input-len 1700 --output-len
#        128 --num-prompts 8" (about 2,000 prompt tokens), with TRIO_ARGS="--max-model-len 4096"
#        as vLLM's is)
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
    sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
fi
rounds="${1:-2}"
peers="${PEERS:-$(cd .. && pwd)/peers}"
out="${OUT:-/tmp/interleaved}"
mkdir -p "$out"
py=.venv/bin/python
port=8211
hf="$($py -c 'from trio_llm.model_files import resolve_model; print(resolve_model(None).path)')"
gguf="$($py -c 'from trio_llm.model_files import default_gguf_path; print(default_gguf_path())')"

serve_and_load() {  # LABEL ROUND COMMAND...
    local label="$1" round="$2"
    shift 2
    "$@" >"$out/$label-$round.log" 2>&1 &
    local pid=$!
    for _ in $(seq 600); do
        curl -s "localhost:$port/v1/models" 2>/dev/null | grep -q SmolLM && break
        sleep 1
    done
    local extra=()
    # llama.cpp has no ignore_eos: the end-of-turn tokens are pushed down instead.
    [[ $label == llama-cpp ]] && extra=(--no-ignore-eos --extra-body '{"logit_bias":{"0":-100,"2":-100}}')
    # shellcheck disable=SC2206
    local load=(${LOAD:---concurrency 1 8 32 --output-len 64 --prompts-per-client 2 --min-prompts 8})
    $py bench/serving/serve.py --base-url "http://127.0.0.1:$port" --model SmolLM2-135M-Instruct \
        "${load[@]}" --ignore-eos "${extra[@]}" --json "$out/$label-$round.json" 2>/dev/null |
        grep -E '^\| ' | grep -v 'conc\|---' | sort -u |
        awk -F'|' -v r="$round" -v s="$label" \
            '{print "round " r " " s " c=" $3 " tok/s=" $8 " ttft_p99=" $11 " itl_p50=" $12}'
    kill "$pid"
    wait "$pid" 2>/dev/null
    sleep 3
}

for round in $(seq "$rounds"); do
    # shellcheck disable=SC2086
    serve_and_load trio-llm "$round" $py -m trio_llm serve --port $port --log-level warning \
        --max-num-seqs 64 ${TRIO_ARGS:-}
    # TRIO_ALT_ENV="NAME=value ...": trio-llm once more per round with that environment (an A/B
    # of a setting that only an environment variable reaches, e.g. OMP_WAIT_POLICY).
    if [[ -n "${TRIO_ALT_ENV:-}${TRIO_ALT_ARGS:-}" ]]; then
        # shellcheck disable=SC2086
        serve_and_load trio-llm-alt "$round" env ${TRIO_ALT_ENV:-} $py -m trio_llm serve --port $port \
            --log-level warning --max-num-seqs 64 ${TRIO_ALT_ARGS:-}
    fi
    serve_and_load vllm "$round" env VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \
        VLLM_CPU_OMP_THREADS_BIND=0-1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
        "$peers/vllm/bin/vllm" serve "$hf" --served-model-name SmolLM2-135M-Instruct \
        --dtype bfloat16 --max-model-len 4096 --host 127.0.0.1 --port $port
done
[[ -x "$peers/llama/bin/python" ]] || { echo "no llama-cpp-python in $peers/llama: its row skipped"; exit 0; }
serve_and_load llama-cpp 1 "$peers/llama/bin/python" -m llama_cpp.server --model "$gguf" \
    --model_alias SmolLM2-135M-Instruct --host 127.0.0.1 --port $port --n_threads 2 \
    --interrupt_requests False --n_ctx 4096
