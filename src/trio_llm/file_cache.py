"""trio-llm's file cache: where it keeps what it derives once from installed model files (a GGUF
converted to a Hugging Face directory, a Whisper model joined from its parts), and how one such
directory is put there.

Why it is its own module: model_files.py (which resolves every model name) and
speech/models.py (the Whisper names it delegates to) both write here; the cache sits below
both, so neither imports the other to find it.

Invariant: a directory in the cache is complete or absent. It is built in a temporary directory
beside its place and renamed into place under a file lock, so processes starting at once (a
frontend and its engines, replicas) build it once and never read one half-written.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """$TRIO_LLM_CACHE, else $XDG_CACHE_HOME/trio-llm (~/.cache/trio-llm)."""
    root = os.environ.get("TRIO_LLM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "trio-llm"
    )
    return Path(root)


def build_once(
    target: Path, is_built: Callable[[Path], bool], build: Callable[[Path], None]
) -> Path:
    """`target`, built unless `is_built(target)`: `build` fills an empty temporary directory
    it is given, which is then renamed to `target` (under the lock, checked again first)."""
    if is_built(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not is_built(target):
            tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=target.parent))
            try:
                build(tmp)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target
