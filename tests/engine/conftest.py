"""Engine tests share the machine's cores with other test processes: keep torch to one thread.

Without a GPU, the Triton attention backend runs in Triton's interpreter, which must be chosen
before anything imports Triton: here, at collection, like tests/kernels does.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(autouse=True, scope="session")
def _few_threads() -> None:
    torch.set_num_threads(1)
