"""The llama-cpp-python server on the default model's GGUF."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving.peers.base import MODEL_NAME, Server, Skipped, hf_dir, peer_version

LABEL = "llama-cpp-python server"


def gguf_path() -> Path:
    from trio_llm.model_files import default_gguf_path

    return default_gguf_path()


def eos_ids() -> list[int]:
    """Token ids that end SmolLM2-Instruct's turn: `<|im_end|>` (its EOS) and `<|endoftext|>`."""
    added = json.loads((hf_dir() / "tokenizer.json").read_text())["added_tokens"]
    return sorted(t["id"] for t in added if t["content"] in ("<|im_end|>", "<|endoftext|>"))


def servers(args: argparse.Namespace) -> list[Server | Skipped]:
    venv = args.peers_dir / "llama"
    python = venv / "bin" / "python"
    if peer_version(venv, "llama_cpp_python") == "?":
        return [Skipped(LABEL, f"not installed in {venv}")]
    bias = json.dumps({"logit_bias": {str(i): -100.0 for i in eos_ids()}})
    server = Server(
        label=LABEL,
        argv=[
            str(python),
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf_path()),
            "--model_alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--n_threads",
            str(args.server_threads),
            "--interrupt_requests",
            "False",
            # llama-cpp-python's default context is 2048 tokens: the long-context row's
            # 2,000-token prompts and their answers need more (the other servers take 8192).
            "--n_ctx",
            "4096",
        ],
        model=MODEL_NAME,
        ready_path="/v1/models",
        load_args=["--no-ignore-eos", "--extra-body", bias],
        description=f"llama-cpp-python {peer_version(venv, 'llama_cpp_python')} server on the "
        f"Q4_1 GGUF, `--n_threads {args.server_threads} --interrupt_requests False --n_ctx 4096`",
    )
    return [server]
