#!/usr/bin/env bash
# Make the virtualenvs of the peers that bench/serving/compare.py measures trio-llm against, each
# apart from trio-llm's own .venv (they pin other versions):
#   $PEERS/tf     transformers[serving] (`transformers serve --continuous-batching`), CPU torch
#   $PEERS/llama  llama-cpp-python[server], built from source (several minutes; about 25 on 2
#                 busy cores), portable AVX2: a GGML_NATIVE=ON build dies with SIGILL on the AMX
#                 VMs at the first request (DESIGN.md, "Peers on these machines")
# Idempotent: a venv whose peer already imports is left alone. PEERS defaults to ../peers beside
# the repository, where bench/serving/compare.py looks (or set TRIO_LLM_PEERS_DIR for both).
# ONLY=llama (or ONLY=tf) makes just that one.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"  # the repository
PEERS="${TRIO_LLM_PEERS_DIR:-$(dirname "$here")/peers}"
PYTHON="${PYTHON:-python3.11}"
mkdir -p "$PEERS"

ONLY="${ONLY:-}"

if [ "$ONLY" != llama ] && ! "$PEERS/tf/bin/python" -c "import transformers.cli.serving" 2>/dev/null; then
    "$PYTHON" -m venv "$PEERS/tf"
    # torch first, pinned to the CPU build trio-llm uses (pip finds it where scripts/serve.sh
    # does), so transformers does not pull a CUDA build of its own.
    "$PEERS/tf/bin/pip" install --quiet torch==2.13.0
    "$PEERS/tf/bin/pip" install --quiet 'transformers[serving]'
fi

if [ "$ONLY" != tf ] && ! "$PEERS/llama/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    "$PYTHON" -m venv "$PEERS/llama"
    portable="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    # --no-cache-dir: pip would otherwise reuse a wheel built earlier with other flags.
    CMAKE_ARGS="${CMAKE_ARGS:-$portable -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}" \
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
        "$PEERS/llama/bin/pip" install --quiet --no-cache-dir 'llama-cpp-python[server]'
fi

echo "peers ready in $PEERS"
