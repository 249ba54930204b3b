"""Paged-attention kernels for the CUDA path (Triton), each with the torch reference it is tested
against.

Importing this package never imports Triton: the kernels load on first call (compiled where a
CUDA device is visible, interpreted on CPU otherwise; see `_loader`). `triton_available()` says
whether they can run at all.
"""

from trio_llm.kernels._config import DecodeConfig, PrefillConfig, decode_config, prefill_config
from trio_llm.kernels._loader import KernelUnavailableError, triton_available
from trio_llm.kernels.paged_attention import (
    decode_attention,
    decode_attention_ref,
    prefill_attention,
    prefill_attention_ref,
    write_kv,
    write_kv_ref,
)

__all__ = [
    "DecodeConfig",
    "KernelUnavailableError",
    "PrefillConfig",
    "decode_attention",
    "decode_attention_ref",
    "decode_config",
    "prefill_attention",
    "prefill_attention_ref",
    "prefill_config",
    "triton_available",
    "write_kv",
    "write_kv_ref",
]
