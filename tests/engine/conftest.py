"""Engine tests share the machine's cores with other test processes: keep torch to one thread."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _few_threads() -> None:
    torch.set_num_threads(1)
