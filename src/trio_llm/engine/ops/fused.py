"""A decoder layer's elementwise work in one call each: the residual add with the RMS norm,
the rotary embedding, and silu(gate) * up (csrc/fused.cpp), for bf16 and float32 rows on the
CPU.

Why: eagerly these are ~25 torch ops a layer, a few microseconds of dispatch each at decode
sizes, and a lone stream's step on the default model spent more time between its matmuls than
in them (docs/notes/2026-12-04-wave4.md: ~1,200 eager ops a step). torch.compile of the same
pieces made steps slower at these sizes (its call overhead), so these are our own. Each row
is computed from its own values alone, so batch invariance holds. Elsewhere (CUDA, float16,
no compiler, `TRIO_LLM_FUSED=0`) the forward keeps its torch ops (`usable`).
"""

from __future__ import annotations

import logging
import os

import torch
from torch import Tensor

from trio_llm.engine.ops.native import Kernel

KERNEL = Kernel("fused.cpp")
ENV = "TRIO_LLM_FUSED"


def usable(x: Tensor) -> bool:
    """Whether rows like `x` take the fused kernels."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.bfloat16, torch.float32)
        and os.environ.get(ENV, "1") != "0"
        and KERNEL.extension() is not None
    )


def add_rms_norm(x: Tensor, out: Tensor | None, weight: Tensor, eps: float) -> Tensor:
    """`x += out` in place (when `out` is given), then weight * rms_norm(x), as transformers'
    LlamaRMSNorm computes it (normalized in float32, rounded, then scaled)."""
    ext = KERNEL.extension()
    assert ext is not None
    return ext.add_rms_norm(x, out, weight, eps)


def rotate_(
    qk: Tensor, heads: int, head_dim: int, cos: Tensor, sin: Tensor, positions: Tensor
) -> None:
    """Rotary embedding of the first `heads` heads of each row of `qk` [T, >= heads *
    head_dim], in place, by rows `positions` of the tables `cos`, `sin` [positions, head_dim]."""
    ext = KERNEL.extension()
    assert ext is not None
    ext.rotate_(qk, heads, head_dim, cos, sin, positions)


def silu_mul(gate_up: Tensor) -> Tensor:
    """silu(gate_up[:, :n]) * gate_up[:, n:] for gate_up [T, 2 n]."""
    ext = KERNEL.extension()
    assert ext is not None
    return ext.silu_mul(gate_up.contiguous())


if __name__ == "__main__":  # scripts/bootstrap.sh: build now, not at the first engine's start
    logging.basicConfig(level=logging.INFO)
    print(f"fused elementwise kernels: {'built' if KERNEL.extension() else 'not built'}")
