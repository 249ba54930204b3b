"""trio-llm itself, as `trio-llm serve`: one server per --trio-llm-args variant."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from serving.peers.base import MODEL_NAME, SERVER_THREADS, Server, Skipped
from trio_llm.config import EngineArgs

LABEL = "trio-llm"
"""The first variant's label (the others add their flags): the one the targets are read from."""
DEFAULT_ARGS = "--max-num-seqs 64"


def servers(args: argparse.Namespace) -> list[Server | Skipped]:
    """One server per --trio-llm-args."""
    script = Path(sys.executable).with_name("trio-llm")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "trio_llm"]
    servers: list[Server | Skipped] = []
    for i, flags in enumerate(args.trio_llm_args):
        extra = shlex.split(flags)
        if "--num-threads" not in extra and args.server_threads != SERVER_THREADS:
            extra += ["--num-threads", str(args.server_threads)]
        servers.append(
            Server(
                label=LABEL if i == 0 else f"{LABEL} {flags}",
                argv=[*launcher, "serve", "--port", "{port}", "--log-level", "warning", *extra],
                model=MODEL_NAME,
                ready_path="/health",
                load_args=["--ignore-eos"],
                description=f"`trio-llm serve {shlex.join(extra)}` (default model, dtype auto)",
            )
        )
    return servers


def primary_engine_args(args: argparse.Namespace) -> EngineArgs:
    """The EngineArgs the first trio-llm variant serves with, as its own CLI parses them."""
    from trio_llm.http import parse_serve_args

    return parse_serve_args(shlex.split(args.trio_llm_args[0])).engine
