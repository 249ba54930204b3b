"""Paged attention: the function transformers calls in every attention layer of a loaded model,
writing each step's new keys and values into the paged KV cache and attending over every
sequence's blocks, for one packed row of tokens (all scheduled tokens of all sequences).

Read in this order: `interface` (what transformers calls, what it is handed, and the packed row's
invariants), then one module per backend, each holding its step metadata, the metadata's builder
and its forward: `torch_backend` (the CPU hot path, with the kernels' call signature and tested
on the kernels' cases) and `triton_backend` (the kernels of `trio_llm.kernels`).
"""

from __future__ import annotations

from trio_llm.engine.attention.interface import (
    ATTN_IMPLEMENTATION,
    AttentionMetadata,
    StepLayout,
    paged_attention,
    register,
)
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.attention.triton_backend import TritonAttentionMetadata, triton_available

__all__ = [
    "ATTN_IMPLEMENTATION",
    "AttentionMetadata",
    "StepLayout",
    "metadata_type",
    "paged_attention",
    "register",
    "resolve_backend",
    "triton_available",
]

_METADATA = {"torch": TorchAttentionMetadata, "triton": TritonAttentionMetadata}


def resolve_backend(backend: str, device: str) -> str:
    """`auto`: the Triton kernels on CUDA when Triton is installed, the torch path otherwise.
    `triton` on a CPU runs the kernels in Triton's interpreter: slow, but it tests the dispatch."""
    if backend == "auto":
        return "triton" if device.startswith("cuda") and triton_available() else "torch"
    if backend == "triton":
        if not triton_available():
            raise ValueError("attention_backend 'triton' asked for, but Triton is not installed")
    elif backend not in _METADATA:
        raise ValueError(f"unknown attention_backend {backend!r}; use auto, torch or triton")
    return backend


def metadata_type(backend: str) -> type[TorchAttentionMetadata] | type[TritonAttentionMetadata]:
    """The metadata class of a resolved backend; its `build(layout, cache)` makes one step's."""
    return _METADATA[backend]
