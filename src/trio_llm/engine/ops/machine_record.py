"""Choices timed on this machine, remembered from one start to the next.

Why: a choice made by timing decides which kernel computes a row (dense_copies' crossovers: from
how many rows a call takes the dense copy rather than the quantized kernel), and the kernels
round differently. Timed afresh at every start, three starts of the default model on one quiet
machine picked three different sets of crossovers (576x1536 from 8 or 16 rows, the LM head from
1 or 2), and in one of them one of 8 greedy prompts was answered differently: a restart changed
an answer. Recorded once, keyed by everything the timing depends on (the CPU's flags, torch, the
thread count and what was timed), every later start chooses alike and skips the timing.
Deleting the file times again.

The record lives beside the kernel builds (`cache_root`, `TRIO_LLM_KERNEL_CACHE` overrides it),
one small JSON file, updated under an flock so that engines started together do not drop each
other's entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

import torch

from trio_llm.engine.ops import cpu

log = logging.getLogger(__name__)

FILE_NAME = "measured.json"


def cache_root() -> Path:
    """Where this machine's kernel builds and measurements are kept."""
    base = os.environ.get("TRIO_LLM_KERNEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trio-llm", "kernels"
    )
    return Path(base)


def cpu_flags() -> str:
    """This CPU's instruction-set flags, sorted into one string: what `-march=native` and
    oneDNN's kernel choice depend on."""
    return " ".join(sorted(cpu.cpu_flags()))


def machine_key(*parts: object) -> str:
    """A key for a measurement of `parts` on this machine, with these settings."""
    digest = hashlib.sha256()
    for part in (cpu_flags(), torch.__version__, torch.get_num_threads(), *parts):
        digest.update(repr(part).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


class MachineRecord:
    """Measured integers by key, in one JSON file."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or cache_root() / FILE_NAME

    def recall_or_measure(self, key: str, measure: Callable[[], int]) -> tuple[int, bool]:
        """The recorded value for `key`, or `measure()`'s, recorded; and whether it was
        recalled. A record that cannot be read or written is measured around, never fatal."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path.with_suffix(".lock"), "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                entries = self._read()
                if isinstance(entries.get(key), int):
                    return entries[key], True
                value = measure()
                entries[key] = value
                temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
                temporary.write_text(json.dumps(entries, indent=0, sort_keys=True))
                os.replace(temporary, self.path)
                return value, False
        except OSError as exc:
            log.warning("measurements not recorded (%s): timed at every start", exc)
            return measure(), False

    def _read(self) -> dict[str, int]:
        try:
            entries = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}
