"""Where the kernel tests run: on the GPU when one is visible, else in Triton's CPU interpreter.

TRITON_INTERPRET is read when Triton decorates a function, Triton's own library included, so it
is set here, at collection, before anything in this directory imports Triton.
`test_runs_where_expected` checks that the setting took.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
from threadpoolctl import threadpool_limits

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if KERNEL_DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    """The interpreter runs each `tl.dot` as a small numpy matmul. OpenBLAS's default thread pool
    made a 128x64x64 one take 20 ms instead of 0.02 ms on a busy 2-core machine (its threads
    spin against each other and against other processes), so the kernel tests run single-threaded
    BLAS."""
    with threadpool_limits(1, user_api="blas"):
        yield


@pytest.fixture
def device() -> torch.device:
    return torch.device(KERNEL_DEVICE)
