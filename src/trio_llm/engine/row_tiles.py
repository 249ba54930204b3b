"""Batch invariance of the matmuls: every row computed the same way whatever rows share its call.

A matmul library picks its kernel (and with it the order in which a row's products are summed)
by the shape of the call, the number of rows among it. So the same token's hidden state comes out
a few ulps different when it is computed alone, with 7 other decodes, or inside a 512-token
prefill chunk, and in bfloat16 that is enough to flip a greedy choice (3 of 12 requests sent
together answered differently from alone, measured on an AMX Xeon).

The fix is to give the library only calls it computes row by row identically. Which those are is
the library's business and differs between machines, so the engine measures it at start-up
(`probe`) on the model's own matmul shapes: the largest tile size T such that every call of 1..T
rows gives each row bitwise what a call of that row alone gives. Then every matmul is split into
calls of at most T rows (`tiled`), and no row's result depends on the batch. Measured on an AMX
Xeon with torch 2.13: bfloat16 (oneDNN) is row-exact up to 32 rows, so tiles of 32 cost nothing
in a decode step of up to 32 sequences; float32 (MKL) computes a lone row differently from every
larger call, so no unpadded tile works there, and invariance would need calls padded to a fixed
size (`padded`), which makes a lone stream 2.6-3x slower; that cost is why it is not the default
in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]

CANDIDATES = (64, 32, 16, 8)
"""Tile sizes tried, largest first; below 8 rows the tiles would cost too many calls."""
KEY_BUCKET = 64
"""With invariance on, each query attends over its context rounded up to a multiple of this,
so the attention call that computes it has the same shape in any batch (StepLayout.key_bucket)."""
PADDED_TILE = 8
"""The call size of `padded` when invariance is forced where no unpadded tile is row-exact."""


def probe(shapes: Iterable[tuple[int, int]], dtype: torch.dtype, device: torch.device) -> int:
    """The largest candidate T for which every call of 1..T rows is row-exact on `shapes`
    ((out_features, in_features) of the model's weights), or 0 if none is."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    best = max(CANDIDATES)
    for out_features, in_features in shapes:
        weight = (torch.randn(out_features, in_features, generator=generator) * 0.05).to(
            device=device, dtype=dtype
        )
        x = torch.randn(best, in_features, generator=generator).to(device=device, dtype=dtype)
        alone = torch.cat([F.linear(x[i : i + 1], weight) for i in range(best)])
        exact = 0
        for rows in range(1, best + 1):
            if not torch.equal(F.linear(x[:rows], weight), alone[:rows]):
                break
            exact = rows
        best = max((t for t in CANDIDATES if t <= exact), default=0)
        if best == 0:
            return 0
    return best


def tiled(tile: int) -> Linear:
    """`F.linear` in calls of at most `tile` rows: row-exact when `probe` returned `tile`."""

    def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = x.shape[0]
        if rows <= tile:
            return F.linear(x, weight, bias)
        out = x.new_empty(rows, weight.shape[0])
        for start in range(0, rows, tile):
            out[start : start + tile] = F.linear(x[start : start + tile], weight, bias)
        return out

    return linear


def padded(tile: int) -> Linear:
    """`F.linear` in calls of exactly `tile` rows (the last one padded with zeros): the same call
    shape for every row, hence row-exact on any library, at the price of the padding."""

    def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        rows = x.shape[0]
        whole = -(-rows // tile) * tile
        if whole != rows:
            x = torch.cat([x, x.new_zeros(whole - rows, x.shape[1])])
        out = x.new_empty(whole, weight.shape[0])
        for start in range(0, whole, tile):
            out[start : start + tile] = F.linear(x[start : start + tile], weight, bias)
        return out[:rows]

    return linear
