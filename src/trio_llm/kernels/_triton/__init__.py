"""Triton kernels for the paged KV cache (write K/V by slot, decode attention, prefill attention)
and for structured outputs (a grammar's token bitmask applied to the logits).

Imported only through `trio_llm.kernels._loader`, which decides (before this package's
`@triton.jit` decorators run) whether the kernels are compiled for the GPU or interpreted on CPU.
One module per kernel entry point (`write_kv`, `decode`, `prefill`, `token_bitmask`), and `tile`
for the tile step and launch parameters the two attention kernels share.

Layout invariants every kernel keeps: a cache is `[num_blocks, block_size, Hkv, D]` with a unit
stride along D; token `pos` of sequence b lives in block `block_tables[b, pos // block_size]` at
offset `pos % block_size`; scores are kept in the log2 domain (`scale * log2(e)` folded in, so
`exp2` replaces `exp`) and every sum is fp32 whatever the input dtype.

Work split, chosen for a memory-bound decode:
- one program per (sequence, KV head, context split) handles the whole query group of that KV
  head, so each K/V byte is read once per step however many query heads share it (GQA);
- the K/V tile spans BLOCK_N tokens, independent of the cache's block size: each token's block id
  is looked up in the block table (an L1-resident read), so a tile can span several pages and keep
  many independent loads in flight;
- long contexts are split into `num_splits` chunks (flash-decoding); each writes an unnormalised
  partial output with its running max and sum, and a small reduce kernel merges them.
"""

from __future__ import annotations

import triton.language as tl

from trio_llm.kernels._triton.decode import decode_attention, decode_kernel
from trio_llm.kernels._triton.prefill import prefill_attention, prefill_kernel
from trio_llm.kernels._triton.token_bitmask import apply_token_bitmask
from trio_llm.kernels._triton.write_kv import write_kv

__all__ = [
    "apply_token_bitmask",
    "decode_attention",
    "decode_kernel",
    "prefill_attention",
    "prefill_kernel",
    "tl",
    "write_kv",
]
