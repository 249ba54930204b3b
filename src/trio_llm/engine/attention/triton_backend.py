"""The Triton attention backend: the paged-attention kernels of `trio_llm.kernels`, the CUDA path.

The kernels read the block tables themselves, so a step's metadata is just the kernels'
arguments as device tensors; nothing is gathered on the host. On a CPU the kernels run in
Triton's interpreter: slow, but it tests this dispatch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from torch import Tensor

from trio_llm.engine.attention.interface import (
    StepLayout,
    ToDevice,
    as_tensor,
    decodes_then_prefills,
)

UNSUPPORTED = {
    "softcap": "the Triton kernels have no attention soft-capping",
    "sliding_window": "the Triton kernels have no sliding windows",
}
"""What the kernels cannot honour, with the reason the engine gives when a model needs it."""


@dataclass(slots=True)
class TritonAttentionMetadata:
    """One step of the Triton backend."""

    slot_mapping: Tensor
    """[T] int64: where each new token's K/V go."""
    num_decodes: int
    block_tables: Tensor
    """[B, max_blocks] int32, decodes first."""
    context_lens: Tensor
    """[B] int32: K/V length of each sequence including this step's tokens."""
    cu_seqlens_q: Tensor
    """[num_prefills + 1] int32: prefill chunk boundaries, relative to row `num_decodes`."""

    @classmethod
    def build(
        cls, layout: StepLayout, cache: Tensor, to_device: ToDevice | None = None
    ) -> TritonAttentionMetadata:
        """`to_device(name, array)`: how the arrays reach the cache's device (the runner's
        pinned staging buffers); plain copies without it."""
        stage = to_device or (lambda _, array: as_tensor(array, cache.device))
        nd = layout.num_decodes
        cu = layout.cu_seqlens_q[nd:] - layout.cu_seqlens_q[nd]
        return cls(
            slot_mapping=stage("slot_mapping", layout.slot_mapping),
            num_decodes=nd,
            block_tables=stage("block_tables", layout.block_tables.astype(np.int32)),
            context_lens=stage("context_lens", layout.context_lens.astype(np.int32)),
            cu_seqlens_q=stage("cu_seqlens_q", cu.astype(np.int32)),
        )

    def forward(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        k_cache: Tensor,
        v_cache: Tensor,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
    ) -> Tensor:
        """`window` is ignored: the engine runs a sliding-window model on these kernels only
        when no context can outgrow its window (`UNSUPPORTED`); `softcap` never comes."""
        from trio_llm.kernels import decode_attention, prefill_attention, write_kv

        if softcap:
            raise NotImplementedError(UNSUPPORTED["softcap"])

        write_kv(k, v, k_cache, v_cache, self.slot_mapping)
        nd = self.num_decodes
        tables, lens = self.block_tables, self.context_lens

        def decode(qd: Tensor) -> Tensor:
            return decode_attention(
                qd.contiguous(), k_cache, v_cache, tables[:nd], lens[:nd], scale
            )

        def prefill(qp: Tensor, out: Tensor) -> None:
            cu = self.cu_seqlens_q
            out[:] = prefill_attention(
                qp.contiguous(), k_cache, v_cache, tables[nd:], cu, lens[nd:], scale
            )

        return decodes_then_prefills(q, nd, decode, prefill)


def triton_available() -> bool:
    try:
        from trio_llm.kernels import triton_available
    except ImportError:
        return False
    return triton_available()
