"""Lazy loading of the Triton kernels, and the one decision made at that moment: compiled or
interpreted.

`triton.jit` reads TRITON_INTERPRET when a function is decorated: Triton's own library functions
(`tl.zeros`, `tl.sum`, ...) when `triton` is first imported, ours when the `_triton` package is.
Invariant: the two agree. The setting is settled here before anything of Triton is imported: an
explicit TRITON_INTERPRET wins; otherwise a process that sees no CUDA device interprets (the
kernels then run on CPU tensors, slowly, as in the tests) and one that sees a device compiles.
If some other code imported Triton under a different setting, loading fails with a clear error
rather than miscomputing.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from types import ModuleType


class KernelUnavailableError(RuntimeError):
    """The Triton kernels were asked for where they cannot run."""


@functools.cache
def triton_available() -> bool:
    """Whether Triton is installed (on a machine without a GPU the kernels then run interpreted).
    Answers without importing Triton, so it never fixes the interpreter setting too early."""
    return importlib.util.find_spec("triton") is not None


@functools.cache
def load_triton() -> ModuleType:
    """The kernel module, imported once, compiled or interpreted as the module docstring says."""
    if not triton_available():
        raise KernelUnavailableError(
            "the Triton kernels need the `triton` package; use the torch attention backend"
        )
    if "TRITON_INTERPRET" not in os.environ:
        import torch

        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
    module = importlib.import_module("trio_llm.kernels._triton")
    if _is_interpreted(module.decode_kernel) != _is_interpreted(module.tl.zeros):
        raise KernelUnavailableError(
            "Triton was imported before TRITON_INTERPRET took its current value; set it in the "
            "environment before the process starts (1 on a machine without a GPU)"
        )
    return module


def _is_interpreted(fn: object) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(fn, InterpretedFunction)


def interpreted() -> bool:
    """Whether the loaded kernels run in Triton's CPU interpreter rather than compiled."""
    return _is_interpreted(load_triton().decode_kernel)
