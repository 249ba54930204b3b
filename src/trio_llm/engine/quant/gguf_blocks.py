"""GGUF's quantized block formats, unpacked into the kernels' layouts once at load.

Why these and no others exactly: Q4_0, Q4_1 and Q4_K store each group of 32 weights as 4-bit
values with a scale and an offset, `w = d * q + m` (Q4_0: `d * (q - 8)`; Q4_K: per 32-weight
sub-block `d * sc * q - dmin * m` with 6-bit `sc`, `m`), which is exactly what the int4 kernel
computes, `(q - 8) * scale + zero`, with `scale = d`, `zero = m + 8 d`: the values and the
layout of the groups carry over unchanged (only the fp16 scales are rounded to bf16). The other
formats (Q8_0, Q6_K, Q5_*, Q2_K, Q3_K, ...) have no kernel in torch for their grouping (8 or 6
bits with a scale per 32 or 16 weights); they are dequantized once at load and requantized to
int8 with a scale per row, which keeps their 8-bit (or finer) resolution within half a step of
the row's scale (`Int8Weight`).

Layouts follow ggml-quants.c (block_q4_0 etc.); tests check every one against the `gguf`
package's reference dequantization.
"""

from __future__ import annotations

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

INT4_FORMATS = frozenset({Q.Q4_0, Q.Q4_1, Q.Q4_K})
"""Run as one int4 matrix."""
SPLIT_FORMATS = frozenset({Q.Q8_0})
"""Run as two int4 planes (`weights.split_int8`)."""
FLOAT_FORMATS = frozenset({Q.F32, Q.F16, Q.BF16})
FLOAT_BLOCK_FORMATS = frozenset({Q.Q4_0, Q.Q4_1, Q.Q8_0})
"""Kept as their blocks where float32 values are asked for (`--dtype float32 --quantization
none`): `w = d * q (+ m)` per 32 weights, which the float32 strip kernel dequantizes as the
`gguf` package does (ops/f32_rows.py's `F32BlockWeight`)."""


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes of a 32-weight block -> [..., 32] values: weight j in the low nibble of
    byte j, weight j + 16 in its high nibble."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=-1)


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)[..., 0]


def unpack_int4(kind: Q, raw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`raw` [rows, bytes per row] of a Q4_0, Q4_1 or Q4_K tensor -> (q [rows, K] uint8 in
    0..15, scale and zero [rows, K / 32] float32) with `w = (q - 8) * scale + zero`."""
    rows = raw.shape[0]
    if kind == Q.Q4_0:
        blocks = raw.reshape(rows, -1, 18)
        d = _f16(blocks[..., 0:2])
        q = _nibbles(blocks[..., 2:])
        return q.reshape(rows, -1), d, np.zeros_like(d)
    if kind == Q.Q4_1:
        blocks = raw.reshape(rows, -1, 20)
        d, m = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        q = _nibbles(blocks[..., 4:])
        return q.reshape(rows, -1), d, m + 8 * d
    if kind == Q.Q4_K:
        blocks = raw.reshape(rows, -1, 144)
        d, dmin = _f16(blocks[..., 0:2]), _f16(blocks[..., 2:4])
        sc, mn = _k4_scales(blocks[..., 4:16])  # [rows, superblocks, 8]
        qs = blocks[..., 16:].reshape(rows, -1, 4, 32)  # 4 chunks of 64 weights
        # In each chunk, the low nibbles are sub-block 2c, the high nibbles sub-block 2c + 1.
        q = np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(rows, -1)
        scale = (d[..., None] * sc).reshape(rows, -1)
        offset = (dmin[..., None] * mn).reshape(rows, -1)
        return q, scale, 8 * scale - offset
    raise ValueError(f"{kind.name} is not a 4-bit group format")


def _k4_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit scales and mins packed in Q4_K's 12 bytes (ggml's get_scale_min_k4)."""
    s = scales.astype(np.uint8)
    sc = np.empty((*s.shape[:-1], 8), np.float32)
    mn = np.empty_like(sc)
    sc[..., :4] = s[..., 0:4] & 63
    mn[..., :4] = s[..., 4:8] & 63
    sc[..., 4:] = (s[..., 8:12] & 0x0F) | ((s[..., 0:4] >> 6) << 4)
    mn[..., 4:] = (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)
    return sc, mn


def unpack_q8_0(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`raw` [rows, bytes per row] of a Q8_0 tensor -> (q [rows, K] int8, d [rows, K / 32]
    float32) with `w = d * q`."""
    blocks = raw.reshape(raw.shape[0], -1, 34)
    q = np.ascontiguousarray(blocks[..., 2:]).view(np.int8).reshape(raw.shape[0], -1)
    return q, _f16(blocks[..., 0:2])


def unpack_float_blocks(
    kind: Q, raw: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """`raw` [rows, bytes per row] of a `FLOAT_BLOCK_FORMATS` tensor -> (q [rows, K] int8, d
    and m [rows, K / 32] float32, m None where the format has none) with the `gguf` package's
    values: `d * q` rounded, then `+ m` rounded (Q4_0's q is its nibble less 8)."""
    if kind == Q.Q8_0:
        q8, d = unpack_q8_0(raw)
        return q8, d, None
    q, d, _ = unpack_int4(kind, raw)
    if kind == Q.Q4_0:
        return (q.astype(np.int8) - 8).astype(np.int8), d, None
    if kind == Q.Q4_1:
        m = _f16(raw.reshape(raw.shape[0], -1, 20)[..., 2:4])
        return q.astype(np.int8), d, m
    raise ValueError(f"{kind.name} is not kept as float blocks")


def dequantize(kind: Q, raw: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    """Any format the `gguf` package reads, as float32 [rows, K]."""
    values = quants.dequantize(np.asarray(raw), kind)
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))
