"""`trio_llm.kernels` without Triton: the package imports, says so, and refuses with a typed
error; and importing it never imports Triton (whose import would fix the interpreter setting)."""

from __future__ import annotations

import subprocess
import sys

LAZY = """
import sys
import trio_llm.kernels
print("triton imported:", "triton" in sys.modules)
"""

WITHOUT_TRITON = """
import sys
sys.modules["triton"] = None  # what importlib sees when the package is not installed
import torch
from trio_llm import kernels
print("available:", kernels.triton_available())
cache = torch.zeros(1, 16, 1, 64)
try:
    kernels.decode_attention(
        torch.zeros(1, 1, 64), cache, cache, torch.zeros(1, 1, dtype=torch.int32),
        torch.ones(1, dtype=torch.int32), 1.0,
    )
except kernels.KernelUnavailableError as e:
    print("refused:", e)
"""


def _run(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_importing_the_package_does_not_import_triton() -> None:
    assert "triton imported: False" in _run(LAZY)


def test_without_triton_the_kernels_refuse_with_a_typed_error() -> None:
    out = _run(WITHOUT_TRITON)
    assert "available: False" in out
    assert "refused: the Triton kernels need the `triton` package" in out
