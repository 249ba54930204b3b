"""Quantized weights that stay quantized: what the own forward's `linear` hook multiplies by.

Why these two kernels: torch ships CPU kernels for both weight-only layouts, and measured on the
AMD EPYC (AVX512-BF16, no AMX, bench/results/quant_kernels.md) they read a lone stream's weights
4-6x faster than oneDNN's bf16 matmul reads the same matrix in bf16, because they read a quarter
(int4) or half (int8) of the bytes:
- `Int4Weight`: 4-bit values with a bf16 scale and zero per group of `group` weights along the
  input dimension, `w = (q - 8) * scale + zero` (`_weight_int4pack_mm_for_cpu`). GGUF's Q4_0,
  Q4_1 and Q4_K blocks are exactly of this form (their fp16 block scales rounded to bf16).
- `Int8Weight`: 8-bit values with one scale per output row, `w = q * scale`
  (`_weight_int8pack_mm`). It also serves embedding lookups (a few rows dequantized per step),
  so a tied LM head and embedding share one copy.
Both kernels compute in float32 from bf16 activations, one output row at a time in a fixed order
over the input dimension, so a row's result does not depend on which other rows share the call
(checked by tests/engine/test_quant.py: they are row-exact at every batch size, the batch
invariance that oneDNN's bf16 matmul gives only up to 64 rows). Their float32-activation paths
are not vectorized (15x slower measured), so a quantized model runs its activations in bfloat16.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.ops.int4_rows import RowsExact
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.ops.matmul import Weight, multiply

Linear = Callable[[Tensor, Tensor, Tensor | None], Tensor]

INT4_GROUP_SIZES = (32, 64, 128, 256)
"""What `_weight_int4pack_mm_for_cpu` accepts."""
_N_ALIGN = 64
"""`_convert_weight_to_int4pack_for_cpu` packs output rows in blocks of `block_rows()` (a tail
is packed otherwise): padded to whole blocks of 64, the packing is one layout (`dequantize`):
with B = block_rows(), block b's bytes are a [in_features, B / 2] array whose byte [k, j] holds
row B b + j's weight k in its low nibble and row B b + B / 2 + j's in its high nibble."""


@functools.cache
def block_rows() -> int:
    """The rows of a block of torch's int4 packing here: 64 where ATen's CPU kernels are built
    for AVX-512, 32 for AVX2 (its CPU capability, not a constant: reading an AVX2 packing as
    AVX-512's gave every weight and embedding row of the default model wrong values on the
    pool's AVX2-only class). Found by packing a probe, as the engine will pack."""
    gen = torch.Generator().manual_seed(0)
    probe = torch.randint(0, 16, (_N_ALIGN * 2, 64), generator=gen, dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    for rows in (64, 32):
        if torch.equal(_unpack(packed, 64, rows).int(), probe):
            return rows
    raise RuntimeError(
        "torch's int4 packing on this CPU (ATen capability "
        f"{torch.backends.cpu.get_cpu_capability()}) is not one the engine reads; serve this "
        "model with --quantization none"
    )


def _unpack(
    packed: Tensor, in_features: int, rows: int, dtype: torch.dtype = torch.uint8
) -> Tensor:
    """The 4-bit values [padded rows, in_features] of a packing in blocks of `rows`."""
    blocks = packed.view(-1, in_features, rows // 2)
    q = torch.empty(blocks.shape[0], rows, in_features, dtype=dtype)
    q[:, : rows // 2].copy_((blocks & 15).transpose(1, 2))
    q[:, rows // 2 :].copy_((blocks >> 4).transpose(1, 2))
    return q.view(-1, in_features)


DENSE_ROWS = {"int4": 128, "int8": 128}
"""Calls of at least this many rows dequantize the weight to the activations' dtype and use the
float matmul: the quantized kernels dequantize a weight tile for every 4 rows, so their cost
grows with the rows (measured on the EPYC, 1 thread: they lose to bf16 from 16 rows on, 2.3x at
64 rows, 3x at 512), but a dequantization costs about a 200-row float matmul of the weight
(bench/results/quant_kernels.md): prefill chunks gain, decode batches do not. An LM head call
is this large only for prompt logprobs (it takes the sampled rows)."""
NEVER_DENSE = 1 << 62
"""`dense_rows` of a weight whose row-exact kernel beat its dense copy at a prefill chunk's rows
too (models/dense_copies.py): no copy is kept, and no call dequantizes it."""


@dataclass(slots=True, eq=False)
class Int4Weight:
    packed: Tensor
    """The kernel's own packing of the 4-bit values (uint8, two per byte, rows padded to 16)."""
    scales_zeros: Tensor
    """[in_features / group, padded out_features, 2]: scale and zero per group, bf16."""
    group: int
    out_features: int
    in_features: int
    split: bool = False
    """Two 4-bit planes of an 8-bit matrix stacked along the rows (`split_int8`)."""
    dense: Weight | None = None
    """The dequantized matrix in the activations' dtype, packed for oneDNN, kept for calls of
    many rows (models/dense_copies.py); None: none is kept."""
    dense_rows: int = 0
    """Calls of at least this many rows take `dense` (where it is kept)."""
    exact: RowsExact | IntRows | None = None
    """The same values in a row-exact kernel's packing (ops/int4_rows.py's or ops/int_rows.py's),
    multiplied by it instead of torch's (`keep_exact`): row-exact and fast at every row count,
    for a batch-invariant engine."""

    @property
    def shape(self) -> tuple[int, int]:
        return (self.out_features, self.in_features)

    @property
    def dtype(self) -> torch.dtype:
        return self.scales_zeros.dtype

    def values(self) -> tuple[Tensor, Tensor, Tensor]:
        """The 4-bit values [rows, in_features] in 0..15 and their scales and zeros [rows,
        in_features / group], out of the torch packing (the layout `_N_ALIGN` describes; its
        padded rows included)."""
        q = _unpack(self.packed, self.in_features, block_rows())
        return q, self.scales_zeros[..., 0].t(), self.scales_zeros[..., 1].t()

    def keep_exact(self, packing: type[RowsExact] | type[IntRows] = RowsExact) -> None:
        """Repack for a row-exact kernel (`exact`), ops/int4_rows.py's float one or
        ops/int_rows.py's integer one by `packing`, out of the torch packing: the same 4-bit
        values, scales and zeros. Two planes of an 8-bit matrix become that matrix again in the
        kernel's 8-bit packing: one product where torch's kernel takes two."""
        q, scale, zero = self.values()
        n = self.out_features  # not the torch packing's padded rows
        if self.split:  # `split_int8`: q = 16 (top - 8) + bottom, at the bottom plane's scale
            half = self.packed.shape[0] // 2
            values = 16 * (q[:n].to(torch.int16) - 8) + q[half : half + n]
            self.exact = packing.pack8(values.to(torch.int8), scale[half : half + n])
        else:
            self.exact = packing.pack(q[:n], scale[:n], zero[:n])

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    def dequantize(self) -> Tensor:
        """The float matrix, [out_features, in_features], in the activations' dtype: bitwise
        what the kernel multiplies by (`addcmul` computes in float32 and rounds once, as the
        kernel does)."""
        k = self.in_features
        # Two planes are summed in float32 and rounded once, as the kernel's products are.
        work = torch.float32 if self.split else self.dtype
        q = _unpack(self.packed, k, block_rows(), work)
        groups = q.view(-1, k // self.group, self.group).sub_(8)
        scale = self.scales_zeros[..., 0].t().unsqueeze(-1).to(work)
        zero = self.scales_zeros[..., 1].t().unsqueeze(-1).to(work)
        w = torch.empty_like(groups)
        torch.addcmul(zero, groups, scale, out=w)
        w = w.view(-1, k)
        if self.split:
            half = self.packed.shape[0] // 2
            return (w[:half] + w[half:])[: self.out_features].to(self.dtype)
        return w[: self.out_features]

    def matmul(self, x: Tensor, bias: Tensor | None) -> Tensor:
        if self.exact is not None:
            out = self.exact.matmul(x)  # the matrix itself, planes or not
            return out if bias is None else out + bias
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(
            x.contiguous(), self.packed, self.group, self.scales_zeros
        )
        if self.split:
            # Two planes of the same matrix (`split_int8`): their sum is the weight's product.
            half = self.packed.shape[0] // 2
            out = out[:, : self.out_features] + out[:, half : half + self.out_features]
        elif out.shape[1] != self.out_features:
            out = out[:, : self.out_features]
        return out if bias is None else out + bias

    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` dequantized (an embedding lookup), read out of the packed layout."""
        k, b = self.in_features, block_rows()
        blocks = self.packed.view(-1, k, b // 2)
        planes = [ids] if not self.split else [ids, ids + self.packed.shape[0] // 2]
        out = None
        for r in planes:
            q = (
                blocks[r // b, :, r % (b // 2)]
                >> (4 * ((r % b) // (b // 2))).to(torch.uint8)[:, None]
            )
            groups = (q & 15).view(len(r), k // self.group, self.group).float()
            scale = self.scales_zeros[:, r, 0].t().unsqueeze(-1).float()
            zero = self.scales_zeros[:, r, 1].t().unsqueeze(-1).float()
            w = ((groups - 8) * scale + zero).view(len(r), k)
            out = w if out is None else out + w
        assert out is not None
        return out.to(self.dtype)

    @classmethod
    def pack(cls, q: Tensor, scale: Tensor, zero: Tensor, dtype: torch.dtype) -> Int4Weight:
        """From unpacked values `q` [N, K] in 0..15 and `scale`, `zero` [N, K / group], meaning
        `w = (q - 8) * scale + zero`."""
        out_features, in_features = q.shape
        group = in_features // scale.shape[1]
        if group not in INT4_GROUP_SIZES or group * scale.shape[1] != in_features:
            raise ValueError(f"int4 groups of {group} are not supported (use {INT4_GROUP_SIZES})")
        pad = -out_features % _N_ALIGN
        if pad:
            q = F.pad(q, (0, 0, 0, pad), value=8)
            scale, zero = F.pad(scale, (0, 0, 0, pad)), F.pad(zero, (0, 0, 0, pad))
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
        scales_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(dtype).contiguous()
        return cls(packed, scales_zeros, group, out_features, in_features)


@dataclass(slots=True, eq=False)
class Int8Weight:
    q: Tensor
    """[out_features, in_features] int8."""
    scales: Tensor
    """[out_features], in the activations' dtype."""
    int8_activations: bool = False
    """Quantize each call's activations to int8 per row (absmax) and multiply in integers
    (`torch._int_mm`, oneDNN with VNNI): W8A8, as llama.cpp multiplies its quantized weights
    by int8 activations. Integer sums are exact, so a row's result depends on its own values
    only (row-exact at any size), and at 64 rows it is 2x, at 512 rows 7x faster than bf16
    (bench/results/quant_kernels.md)."""
    dense: Weight | None = None
    """As Int4Weight's: the dequantized matrix kept for calls of many rows."""
    dense_rows: int = 0
    exact: RowsExact | IntRows | None = None
    """As Int4Weight's: the same values multiplied by a row-exact kernel. W8A8 weights: set
    only without invariance (`keep_few_rows`), for calls of fewer than `W8A8_FEW_ROWS` rows."""

    def keep_exact(self, packing: type[RowsExact] | type[IntRows] = RowsExact) -> None:
        """Repack for a row-exact kernel (`exact`, as Int4Weight's); W8A8 weights keep their
        integer matmul, which is row-exact already, where it is exact (`int8_matmul_exact`)."""
        if not self.int8_activations or not int8_matmul_exact():
            self.exact = packing.pack8(self.q, self.scales)

    def keep_few_rows(self, packing: type[RowsExact] | type[IntRows]) -> None:
        """W8A8 without invariance: a row-exact kernel's packing for calls of few rows, where
        `torch._int_mm`'s set-up dominates (one row of 576 x 1536: 71 us against the integer
        kernel's 8, on an AMX Xeon). Its activations are int8 per block of 32, not per row, so
        a row's result then depends on how many rows share its call, as the dense copies make
        it for the other formats."""
        if self.int8_activations:
            self.exact = packing.pack8(self.q, self.scales)

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.q.shape[0]), int(self.q.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.scales.nbytes

    def dequantize(self) -> Tensor:
        return self.q.to(self.dtype) * self.scales[:, None]

    def matmul(self, x: Tensor, bias: Tensor | None) -> Tensor:
        if self.int8_activations and self.exact is not None and not int8_matmul_exact():
            out = self.exact.matmul(x)  # the integer kernel's int8 activations, exact sums
        elif self.int8_activations:
            x32 = x.float()
            step = x32.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127.0
            x8 = torch.round(x32 / step).to(torch.int8)
            if int8_matmul_exact():
                sums = torch._int_mm(x8, self.q.t()).float()
            else:  # no kernel of ours here: float32 sums of the same integers
                sums = x8.float() @ self.q.float().t()
            out = (sums * step * self.scales.float()).to(x.dtype)
        elif self.exact is not None:
            out = self.exact.matmul(x)
        else:
            out = torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.q, self.scales)
        return out if bias is None else out + bias

    def rows(self, ids: Tensor) -> Tensor:
        """Rows `ids` dequantized: an embedding lookup."""
        return (
            self.q.index_select(0, ids).to(self.dtype) * self.scales.index_select(0, ids)[:, None]
        )


@functools.cache
def int8_matmul_exact() -> bool:
    """Whether `torch._int_mm` sums int8 products exactly here. Not without VNNI: oneDNN then
    multiplies by `vpmaddubsw`, whose pair sums saturate at 16 bits once the activations are
    shifted to unsigned bytes, and a W8A8 model's predictions moved by 0.5 nats a token (an
    EPYC with oneDNN held to AVX2, as on the pool's AVX2-only class). There W8A8 weights take
    the integer kernel for every call (its activations are int8 per block of 32, not per
    row), or float32 sums where it is not built. Found by a probe whose sums saturate."""
    x = torch.full((32, 64), 127, dtype=torch.int8)
    w = torch.full((64, 32), 127, dtype=torch.int8)
    return bool((torch._int_mm(x, w) == 64 * 127 * 127).all())


def split_int8(q: Tensor, scale: Tensor, dtype: torch.dtype) -> Int4Weight:
    """An 8-bit matrix with a scale per group of 32 (GGUF's Q8_0: `w = d * q`) as two 4-bit
    planes the int4 kernel multiplies exactly: q = 16 hi + lo with hi in -8..7 and lo in 0..15,
    so `w = 16 d (hi + 8 - 8) + (d (lo - 8) + 8 d)`. Torch has no kernel for group-wise 8 bits,
    and one scale per row lost 1.2% of perplexity on a Q8_0 file (bench/results/
    quant_quality.md); the planes cost 10 bits a weight against the file's 8.5."""
    out_features = q.shape[0]
    rows = -(-out_features // _N_ALIGN) * _N_ALIGN
    q16 = q.to(torch.int16)
    hi = torch.div(q16, 16, rounding_mode="floor")
    lo = q16 - 16 * hi

    def plane(values: Tensor, plane_scale: Tensor, plane_zero: Tensor) -> list[Tensor]:
        pad = rows - out_features
        return [
            F.pad(values, (0, 0, 0, pad), value=8),
            F.pad(plane_scale, (0, 0, 0, pad)),
            F.pad(plane_zero, (0, 0, 0, pad)),
        ]

    top = plane(hi + 8, 16 * scale, torch.zeros_like(scale))
    bottom = plane(lo, scale, 8 * scale)
    weight = Int4Weight.pack(
        *(torch.cat([a, b]) for a, b in zip(top, bottom, strict=True)), dtype=dtype
    )
    weight.out_features, weight.split = out_features, True
    return weight


QuantizedWeight = Int4Weight | Int8Weight

W8A8_FEW_ROWS = 32
"""W8A8 calls of fewer rows take the row-exact kernel's packing where one is kept: on an AMX
Xeon its integer kernel took 0.11-0.58x `torch._int_mm`'s time from 1 to 16 rows, 0.65-1.05x at
32."""


def kernel_dtype(activations: torch.dtype) -> torch.dtype:
    """The dtype quantized weights multiply in for activations of `activations`: their own
    where the kernels are vectorized for it (bf16, fp16), bf16 for float32 activations, whose
    paths in the kernels are not (15x slower measured): a float32 model rounds a quantized
    matmul's inputs to bf16 (its products still sum in float32), which costs nothing against
    the weights' own 4 or 8 bits."""
    return activations if activations in (torch.bfloat16, torch.float16) else torch.bfloat16


def is_quantized(weight: object) -> bool:
    return isinstance(weight, Int4Weight | Int8Weight)


def dispatching(inner: Linear, *, dense: bool = True) -> Linear:
    """The `linear` hook of a forward with quantized weights: their own kernel for them,
    `inner` (the runner's choice for float weights) for the rest.

    With `dense`, a call of many rows goes to `inner` on a float matrix instead: the weight's
    kept dense copy from its measured crossover on (`dense_rows`, models/dense_copies.py), or,
    where no copy is kept, the weight dequantized for the call from `DENSE_ROWS` on (a prefill
    chunk), unless its kernel was measured faster than a copy at every size (`NEVER_DENSE`).
    Without it every row of every call runs on the quantized kernels, which are row-exact
    (batch invariance), at the price of slower batches and prefills where they lose."""

    def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        if not isinstance(weight, Int4Weight | Int8Weight):
            return inner(x, weight, bias)
        if x.dtype != weight.dtype:  # float32 activations (`kernel_dtype`)
            return linear(x.to(weight.dtype), weight, bias).to(x.dtype)
        if isinstance(weight, Int8Weight) and weight.int8_activations:
            if dense and weight.exact is not None and x.shape[0] < W8A8_FEW_ROWS:
                out = weight.exact.matmul(x)
                return out if bias is None else out + bias
            return weight.matmul(x, bias)
        # A crossover measured (`dense_rows`, NEVER_DENSE included), else `DENSE_ROWS`.
        fmt = "int4" if isinstance(weight, Int4Weight) else "int8"
        if dense and x.shape[0] >= (weight.dense_rows or DENSE_ROWS[fmt]):
            if weight.dense is not None:
                return multiply(x, weight.dense, bias)
            return inner(x, weight.dequantize(), bias)
        return weight.matmul(x, bias)

    return linear


def embedding(ids: Tensor, weight: Tensor | QuantizedWeight) -> Tensor:
    if isinstance(weight, Int4Weight | Int8Weight):
        return weight.rows(ids)
    return F.embedding(ids, weight)


def quantize_int8(
    weight: Tensor, dtype: torch.dtype, *, int8_activations: bool = False
) -> Int8Weight:
    """Symmetric, one scale per output row (the largest magnitude maps to 127)."""
    w = weight.detach().float()
    scales = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return Int8Weight(q.contiguous(), scales.to(dtype), int8_activations)


def quantize_int4(weight: Tensor, dtype: torch.dtype, group: int = 32) -> Int4Weight:
    """Asymmetric per group of `group` inputs: the group's minimum and maximum map to 0 and 15."""
    w = weight.detach().float()
    out_features, in_features = w.shape
    if in_features % group:
        raise ValueError(f"in_features {in_features} is not a multiple of the group {group}")
    groups = w.view(out_features, in_features // group, group)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scale = ((high - low) / 15.0).clamp(min=1e-12)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    q = q.view(out_features, in_features).to(torch.uint8)
    return Int4Weight.pack(q, scale, low + 8 * scale, dtype)
