"""The paged KV cache's shape: one key and one value cache per attention layer, each
`[num_blocks, block_size, kv_heads, head_dim]`, and what a block of them costs.

Why its own module: the engine's assembly sizes the cache from it (how many blocks the memory
budget holds, build.py) before the model runner allocates the tensors; layers may differ in
their cache shape (a model's global layers may have wider heads than its local ones), which
`attention_layers.inspect` reads off the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trio_llm.engine.models.attention_layers import AttentionLayer


@dataclass(slots=True)
class KVCacheSpec:
    """The caches of every attention layer, per block."""

    layers: tuple[tuple[int, int], ...]
    """(KV heads, head dim) of each attention layer's cache, in the order the forward calls
    them; layers may differ (a model's global layers may have wider heads than its local)."""
    block_size: int
    dtype: torch.dtype

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def bytes_per_block(self) -> int:
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.block_size * elem * sum(heads * dim for heads, dim in self.layers)


def kv_cache_spec(layers: list[AttentionLayer], block_size: int, dtype: torch.dtype) -> KVCacheSpec:
    """The caches of the attention layers `attention_layers.inspect` found."""
    return KVCacheSpec(
        layers=tuple((layer.num_kv_heads, layer.head_dim) for layer in layers),
        block_size=block_size,
        dtype=dtype,
    )
