"""C++ kernels of our own (csrc/), compiled for this machine the first time they are needed.

Why built here and keyed as they are: the kernels are compiled with `-march=native`, so a
build depends on this CPU's flags as well as the source, torch and Python: a home directory
shared by machines of different CPU classes gets one build per class. `scripts/bootstrap.sh`
builds them at set-up; an engine that finds no build compiles it at start-up, under a lock
that other engines wait on. Without a C++ compiler a kernel is None and its caller serves on
torch's own ops.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import logging
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType

import torch

from trio_llm.engine.ops.machine_record import cache_root, cpu_flags

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
MARCH = "TRIO_LLM_MARCH"
"""An environment variable naming the `-march` to build for instead of `native` (e.g.
`x86-64-v3`: the pool's AVX2-only class): how a benchmark times another class's paths on this
CPU. Serving leaves it unset."""


def flags() -> list[str]:
    """The compiler's flags. -fopenmp: `at::parallel_for` is inline in ATen's headers and runs
    on one thread unless the extension is compiled with OpenMP; it then links torch's own libgomp
    (`_link_flags`), the runtime torch's threads already live in, never a second one."""
    march = os.environ.get(MARCH) or "native"
    return ["-O3", f"-march={march}", "-fopenmp", "-fno-math-errno"]


def _link_flags() -> list[str]:
    """torch's bundled libgomp, by its soname: the loader finds it already loaded by torch."""
    lib = Path(torch.__file__).parent / "lib"
    return (
        [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"]
        if (lib / "libgomp.so.1").exists()
        else []
    )


def _headers() -> list[Path]:
    """The headers the sources share (csrc/*.h): copied beside each build's source."""
    return sorted(CSRC.glob("*.h"))


class Kernel:
    """One C++ source of csrc/ and its build for this machine."""

    def __init__(self, source: str) -> None:
        self.source = CSRC / source
        self.stem = self.source.stem

    def build_key(self) -> str:
        """What the build depends on: source, the headers beside it, flags, torch, Python and
        this CPU's flags."""
        digest = hashlib.sha256()
        options = " ".join(flags() + _link_flags())
        for part in (self.source.read_bytes(), options.encode(), torch.__version__.encode()):
            digest.update(part)
        for header in _headers():
            digest.update(header.read_bytes())
        digest.update(cpu_flags().encode())
        digest.update(sys.version.encode())
        return digest.hexdigest()[:16]

    def build_directory(self) -> Path:
        path = cache_root() / f"{self.stem}_{self.build_key()}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    @functools.cache  # noqa: B019 - one Kernel per source, alive for the process
    def extension(self) -> ModuleType | None:
        """The built kernel, or None (no compiler: the caller serves on torch's ops).

        Two guards around torch's builder. Its own lock is a file that a builder killed
        mid-build (Ctrl-C, a test timeout) leaves behind, and every later engine then waits on
        it forever; so builders take an flock first (the kernel drops it with the process), and
        under it any such file is a dead builder's and is removed. And the source (with the
        headers the sources share) is copied into the build directory and compiled from there,
        so checkouts at different paths (worktrees, CI's clean clone) that share the cache
        share one build instead of rebuilding over each other's."""
        from torch.utils import cpp_extension

        directory = self.build_directory()
        try:
            with open(directory / "build.flock", "w") as guard:
                fcntl.flock(guard, fcntl.LOCK_EX)
                (directory / "lock").unlink(missing_ok=True)
                for original in (self.source, *_headers()):
                    copy = directory / original.name
                    if not copy.exists() or copy.read_bytes() != original.read_bytes():
                        shutil.copyfile(original, copy)
                source = directory / self.source.name
                return cpp_extension.load(
                    name=f"trio_llm_{self.stem}_{self.build_key()}",
                    sources=[str(source)],
                    extra_cflags=flags(),
                    extra_ldflags=_link_flags(),
                    build_directory=str(directory),
                    verbose=False,
                )
        except Exception as exc:  # a missing compiler or headers: serve on torch's ops
            log.warning("%s kernel not built (%s); torch's ops serve instead", self.stem, exc)
            return None
