"""Elementwise functions and MKL computed one way whatever the call's size.

Why: elementwise functions (silu, gelu, tanh) are vectorized in blocks with the remainder in
scalar code that rounds differently, and which elements fall in a remainder depends on how a
call's elements are split between threads, that is on how many rows share the call; `rowwise`
runs such a function on one thread. MKL's fp32 results depend on the alignment of its
per-thread buffers unless its conditional numerical reproducibility mode (CNR) is on, which MKL
takes only before its first call (`enable_reproducible_mkl`, the engine process's first act).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

# -- MKL's reproducibility mode ---------------------------------------------------------------

_MKL_CBWR_BRANCH = 1
_MKL_CBWR_AUTO = 2
_MKL_CBWR_STRICT = 0x10000


def _mkl_cbwr() -> tuple[Callable[[int], int], Callable[[int], int]] | None:
    """MKL's CNR get and set, from the MKL linked into torch; None without MKL."""
    if not torch.backends.mkl.is_available():
        return None
    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        get, set_ = lib.mkl_serv_cbwr_get, lib.mkl_serv_cbwr_set
    except (OSError, AttributeError):
        return None
    for fn in (get, set_):
        fn.argtypes = [ctypes.c_int]
        fn.restype = ctypes.c_int
    return get, set_


def enable_reproducible_mkl() -> bool:
    """Turn MKL's conditional numerical reproducibility on (AUTO, STRICT), which MKL allows only
    before its first call; True if it is on (or there is no MKL to need it)."""
    cbwr = _mkl_cbwr()
    if cbwr is None:
        return True
    get, set_ = cbwr
    if get(_MKL_CBWR_BRANCH) != _MKL_CBWR_BRANCH:  # on already (MKL_CBWR, or an earlier call)
        return True
    return set_(_MKL_CBWR_AUTO | _MKL_CBWR_STRICT) == 0


def mkl_reproducible() -> bool:
    """Whether MKL's CNR mode is on (True without MKL)."""
    cbwr = _mkl_cbwr()
    return cbwr is None or cbwr[0](_MKL_CBWR_BRANCH) != _MKL_CBWR_BRANCH


# -- elementwise functions --------------------------------------------------------------------


@contextlib.contextmanager
def single_threaded() -> Iterator[None]:
    """torch's intra-op threads set to one for the block (4 us a switch here)."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


GRAIN_SIZE = 32768
"""ATen's `at::internal::GRAIN_SIZE`: an elementwise op over fewer elements runs on one thread."""


def rowwise(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """`fn(x)` for an elementwise `fn` with vectorized and scalar code paths, each row of `x`
    through the same path whatever rows share the call: one thread walks the rows in order
    (as ATen does by itself below GRAIN_SIZE elements, where the switch is skipped)."""
    if x.numel() < GRAIN_SIZE:
        return fn(x)
    with single_threaded():
        return fn(x)
