"""Where the kernel tests run: on the GPU when one is visible, else in Triton's CPU interpreter.

TRITON_INTERPRET is read when Triton decorates a function, Triton's own library included, so it
is set here, at collection, before anything in this directory imports Triton.
`test_runs_where_expected` checks that the setting took.
"""

from __future__ import annotations

import os

import pytest
import torch

KERNEL_DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if KERNEL_DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"


@pytest.fixture
def device() -> torch.device:
    return torch.device(KERNEL_DEVICE)
