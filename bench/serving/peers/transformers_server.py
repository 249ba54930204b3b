"""`transformers serve --continuous-batching` on the HF directory of the default model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving.peers.base import Server, Skipped, hf_dir, peer_version

LABEL = "transformers serve"


def transformers_dir() -> Path:
    """The HF directory with `architectures` in its config, which transformers serve needs.

    The loader's GGUF conversion leaves that key out (trio-llm does not need it), so this links
    the converted files into a directory of its own beside it with a completed config.json.
    """
    source = hf_dir()
    target = source.parent / f"{source.name}-transformers-serve"
    target.mkdir(exist_ok=True)
    for item in source.iterdir():
        link = target / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"])
    (target / "config.json").write_text(json.dumps(config, indent=1))
    return target


def servers(args: argparse.Namespace) -> list[Server | Skipped]:
    venv = args.peers_dir / "tf"
    exe = venv / "bin" / "transformers"
    if not exe.exists():
        return [Skipped(LABEL, f"not installed ({exe} missing)")]
    path = str(transformers_dir())
    # A generation_config without eos_token_id: the request runs to max_tokens, like ignore_eos.
    no_eos = json.dumps({"generation_config": json.dumps({"do_sample": False})})
    server = Server(
        label=LABEL,
        argv=[
            str(exe),
            "serve",
            "--continuous-batching",
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--log-level",
            "warning",
            path,
        ],
        model=path,
        ready_path="/health",
        load_args=["--no-ignore-eos", "--extra-body", no_eos],
        description=f"transformers {peer_version(venv, 'transformers')} "
        "`transformers serve --continuous-batching --dtype float32` on the HF directory "
        "converted from the GGUF",
        env={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": str(args.server_threads),
        },
    )
    return [server]
