"""Decode attention over the paged KV cache in place, on the CPU: a C++ kernel of our own
(csrc/paged_decode.cpp), built for this machine the first time it is needed.

Why C++ and why built here: the torch path gathers every context block of every decode into a
buffer per layer, then runs SDPA's flash kernel, made for many queries a head, on one query a
head. Reading the blocks where they lie, one task per sequence, halves the time of a step's
decode attention on one core (and does not fall apart when the two cores are shared, as
OpenMP's barriers in the gather and SDPA do). vLLM's CPU build ships the same idea. The kernel
is compiled with `-march=native`, so the build is keyed by this CPU's flags as well as the
source: a home directory shared by machines of different CPU classes gets one build per class.

`scripts/bootstrap.sh` builds it at set-up (`python -m trio_llm.engine.ops.paged_decode`); an
engine that finds no build compiles it at start-up (about 40 s, under a lock that other engines
wait on). Without a C++ compiler, or with `TRIO_LLM_PAGED_DECODE=0`, the torch path serves, and
the engine says so once.
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
from torch import Tensor

from trio_llm.engine.ops.machine_record import cache_root, cpu_flags

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]
"""-fopenmp: `at::parallel_for` is inline in ATen's headers and runs on one thread unless the
extension is compiled with OpenMP; it then links torch's own libgomp (`_link_flags`), the runtime
torch's threads already live in, never a second one."""
LANES = 16
"""The kernel works in 16-float vectors: head sizes must be a multiple."""
ENV = "TRIO_LLM_PAGED_DECODE"


def _link_flags() -> list[str]:
    """torch's bundled libgomp, by its soname: the loader finds it already loaded by torch."""
    lib = Path(torch.__file__).parent / "lib"
    return (
        [f"-L{lib}", "-l:libgomp.so.1", f"-Wl,-rpath,{lib}"]
        if (lib / "libgomp.so.1").exists()
        else []
    )


def build_key() -> str:
    """What the build depends on: source, flags, torch, Python and this CPU's flags."""
    digest = hashlib.sha256()
    flags = " ".join(FLAGS + _link_flags())
    for part in (SOURCE.read_bytes(), flags.encode(), torch.__version__.encode()):
        digest.update(part)
    digest.update(cpu_flags().encode())
    digest.update(sys.version.encode())
    return digest.hexdigest()[:16]


def build_directory() -> Path:
    path = cache_root() / f"paged_decode_{build_key()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


@functools.cache
def extension() -> ModuleType | None:
    """The built kernel, or None (no compiler: the torch path serves).

    Two guards around torch's builder. Its own lock is a file that a builder killed mid-build
    (Ctrl-C, a test timeout) leaves behind, and every later engine then waits on it forever; so
    builders take an flock first (the kernel drops it with the process), and under it any such
    file is a dead builder's and is removed. And the source is copied into the build directory
    and compiled from there, so checkouts at different paths (worktrees, CI's clean clone) that
    share the cache share one build instead of rebuilding over each other's."""
    from torch.utils import cpp_extension

    directory = build_directory()
    try:
        with open(directory / "build.flock", "w") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            (directory / "lock").unlink(missing_ok=True)
            source = directory / SOURCE.name
            if not source.exists() or source.read_bytes() != SOURCE.read_bytes():
                shutil.copyfile(SOURCE, source)
            return cpp_extension.load(
                name=f"trio_llm_paged_decode_{build_key()}",
                sources=[str(source)],
                extra_cflags=FLAGS,
                extra_ldflags=_link_flags(),
                build_directory=str(directory),
                verbose=False,
            )
    except Exception as exc:  # a missing compiler or headers: serve on the torch path
        log.warning("paged decode kernel not built (%s); decode attention on the torch path", exc)
        return None


def enabled() -> bool:
    """`TRIO_LLM_PAGED_DECODE=0` turns the kernel off (read per call: bench/engine_step/
    step_profile.py compares both in turns)."""
    return os.environ.get(ENV, "1") != "0"


def prepare() -> None:
    """Build or load the kernel now: at engine start, before the engine reports ready, so the
    first request's step does not wait on a compiler."""
    if enabled():
        extension()


def supports(cache: Tensor) -> bool:
    """Whether the kernel computes the decodes of a layer with this cache: on the CPU, a float
    type it reads, a head size it vectorizes, a built kernel, and `enabled()`."""
    return (
        enabled()
        and cache.device.type == "cpu"
        and cache.dtype in (torch.float32, torch.bfloat16, torch.float16)
        and cache.shape[-1] % LANES == 0
        and extension() is not None
    )


def paged_decode(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    scale: float,
    softcap: float | None = None,
    window: int | None = None,
) -> Tensor:
    """q [B, Hq, D] (one query per sequence) over each sequence's first `context_lens[b]`
    positions (the last `window` of them, for a sliding-window layer), read through
    `block_tables` [B, W] (int64) from caches [blocks, block_size, Hkv, D]; [B, Hq, D] back.
    A sequence of context 0 gets zeros."""
    ext = extension()
    assert ext is not None, "paged_decode called where supports() is false"
    return ext.paged_decode(
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables,
        context_lens,
        float(scale),
        float(softcap or 0.0),
        int(window or 0),
    )


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    built = extension()
    print(f"paged decode kernel: {'built in ' + str(build_directory()) if built else 'not built'}")
