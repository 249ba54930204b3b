"""What compare.py knows of a server it measures, and the model files the peers share.

A peer module (one per server, listed in `peers.SERVERS`) turns the command line into `Server`s
to run, or a `Skipped` with the reason when it cannot run here (its virtualenv missing).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

MODEL_NAME = "SmolLM2-135M-Instruct"
SERVER_THREADS = 2
"""The threads a peer that takes a count is given: the machine's 2 cores."""


@dataclasses.dataclass(frozen=True)
class Server:
    label: str
    argv: list[str]
    """Command line; "{port}" is replaced by the port picked for the run."""
    model: str
    """What clients send as `model`."""
    ready_path: str
    load_args: list[str]
    """serve.py flags that make this server do the common work (stop-at-EOS off)."""
    description: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Skipped:
    label: str
    reason: str


def hf_dir() -> Path:
    from trio_llm.model_files import resolve_model

    return resolve_model(None).path


def peer_version(venv: Path, dist: str) -> str:
    """A distribution's version inside another virtualenv, read from its metadata on disk."""
    for site in (venv / "lib").glob("python*/site-packages"):
        for meta in site.glob("*.dist-info"):
            name, _, version = meta.name.removesuffix(".dist-info").partition("-")
            if name.lower().replace("-", "_") == dist.lower().replace("-", "_"):
                return version
    return "?"
