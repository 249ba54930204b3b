"""The engine's matmul: `linear(x, weight, bias)` shaped so that a row's result depends on
the row alone, following a per-CPU-class `MatmulPlan`.

Why the engine shapes its calls itself: MKL and oneDNN pick a kernel, and with it the order in
which a row's products are summed, by the shape of the call (plans/invariance.py says what was
measured on each CPU class). A plan fixes the shapes: oneDNN's inner product on weights
reordered once, long inner dimensions split into equal chunks summed left to right, lone rows
padded, or calls tiled. Without a plan (invariance off) it is `F.linear`. Which plan a machine
gets, and the check that it holds there, are plans/invariance.py's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from trio_llm.engine.ops import bf16_rows, f32_rows
from trio_llm.engine.ops.bf16_rows import StripWeight
from trio_llm.engine.ops.f32_rows import F32StripWeight
from trio_llm.engine.ops.strips import StripMatrix

K_CHUNK = 1024
"""The longest inner dimension oneDNN computes one way for every number of rows."""


@dataclass(frozen=True, slots=True)
class MatmulPlan:
    """How the engine shapes each matmul call so that a row's result depends on the row alone.

    Which plan a CPU class gets is knowledge of its libraries (`plan_for`); `check` verifies it
    on the machine at hand."""

    name: str
    packed: bool = False
    """oneDNN's inner product on weights reordered once, rather than `F.linear`."""
    k_chunk: int | None = None
    """Inner dimensions longer than this are split into equal chunks (multiples of 64), each
    its own call, summed left to right."""
    min_rows: int = 1
    """Calls of fewer rows are padded with zero rows to this many."""
    min_rows_k: int = 0
    """`min_rows` applies only to weights whose inner dimension is longer than this."""
    row_tile: int | None = None
    """Calls of more rows are split into calls of at most this many."""
    invariant: bool = True
    """A plan for batch invariance (the forward then runs its activations row by row too);
    `PACKED` is the one plan for speed alone."""
    strips: torch.dtype | None = None
    """Weights of this dtype that our own row-exact strip kernel for it takes (bf16 with an
    even inner dimension: ops/bf16_rows.py; float32: ops/f32_rows.py) on that instead, every
    call of theirs unpadded."""


FP32_ONEDNN = MatmulPlan(
    "fp32: oneDNN on reordered weights, inner chunks <= 1024", packed=True, k_chunk=K_CHUNK
)
FP32_STRIPS = MatmulPlan(
    "fp32: the own strip kernel, one FMA chain an output", strips=torch.float32
)
"""Where the float32 strip kernel is built with vector FMAs (AVX-512 or AVX2): 1-2 rows
0.43-0.81x `FP32_ONEDNN`'s time on the default model's shapes, 32 rows 0.71-0.97x, 512 rows
0.85-1.02x (an AMD EPYC, 2 threads, bench/results/f32_rows.md); every call unsplit and
unpadded."""
BF16_AVX512 = MatmulPlan(
    "bf16: oneDNN on reordered weights, lone rows padded to 2", packed=True, min_rows=2
)
"""On an AMD EPYC (AVX512-BF16, no AMX), oneDNN's matmul on plain weights computed a row one
way in a lone call, another in calls of 2-16 rows and a third in some larger calls, on narrow
shapes (K=64, N=32 or 48) as well as past K=1024; its inner product on weights reordered once
computes every row alike from two rows up, on every shape tried (K 64 to 8192, N 3 to 49152,
calls up to 2,048 rows), and was 0.7-1.0x the plain matmul's time on the default model's
shapes (docs/notes/2026-12-06-eighth.md)."""
BF16_STRIPS = MatmulPlan(
    "bf16: the own strip kernel, others oneDNN on reordered weights with lone rows padded to 2",
    packed=True,
    min_rows=2,
    strips=torch.bfloat16,
)
"""AVX512-BF16 where our kernel is built, AMX or not: a lone row on oneDNN read the weights at
about a third of what the kernel does (ops/bf16_rows.py); `BF16_AVX512` for what it does not
take. With AMX the kernel runs every call on the tiles: 0.21-0.55x `BF16_AMX`'s time at every
row count from 1 to 512 on the default model's shapes (bench/results/bf16_rows_amx.md)."""
BF16_AMX = MatmulPlan("bf16: oneDNN in calls of at most 32 rows", row_tile=32)
"""AMX where our kernel is not built."""
BF16_PLAIN = MatmulPlan("bf16: torch's own kernel (no oneDNN bf16 here)")
PADDED = MatmulPlan("padded calls of exactly 8 rows", min_rows=8, row_tile=8)
"""The fallback of `on` where a class's plan fails the check: one call shape for every row,
paid for in a lone stream (2-3x slower)."""


def plan_for(dtype: torch.dtype, flags: frozenset[str]) -> MatmulPlan | None:
    """The plan this CPU class's libraries make row-exact, or None where there is none."""
    if not torch.backends.mkldnn.is_available():
        return None
    if dtype is torch.float32:
        return FP32_STRIPS if f32_rows.available() else FP32_ONEDNN
    if dtype is torch.bfloat16:
        if "amx_bf16" in flags:
            return BF16_STRIPS if bf16_rows.available() else BF16_AMX
        if "avx512_bf16" in flags:
            return BF16_STRIPS if bf16_rows.available() else BF16_AVX512
        return BF16_PLAIN
    return None


@dataclass(slots=True)
class PackedWeight:
    """A weight as oneDNN's reordered chunks of its inner dimension."""

    parts: tuple[Tensor, ...]
    spans: tuple[tuple[int, int], ...]
    """Each part's [start, end) of the inner dimension."""
    shape: torch.Size

    @property
    def dtype(self) -> torch.dtype:
        return self.parts[0].dtype

    @property
    def nbytes(self) -> int:
        """What its parts hold (what the weight costs in memory, as a tensor's `nbytes`)."""
        return sum(p.numel() * p.element_size() for p in self.parts)


@dataclass(slots=True, eq=False)
class BandedWeight:
    """One matrix in two forms, each for the calls it is fastest on: the strip kernel on AMX
    tiles for calls of fewer than `rows` rows, oneDNN's reordered copy for the rest.

    Why: the dense copies of a quantized model (models/dense_copies.py) serve decode batches and
    prefill chunks alike. On an AMX Xeon the tiles over the strips took 0.50-0.86x oneDNN's time
    at 32 rows on the default model's shapes, but up to 1.4x at 512 (bench/results/
    bf16_rows_amx.md). With every copy as strips alone (a scratch build), a 32-stream decode
    step went 0.87x and a 2,000-token prompt 1.19x; banded, the step 0.85x and prompts
    1.03-1.04x (bench/results/step_profile_strip_copies_amx.md). The price: the copy's memory
    twice. A row's result depends on its call's rows, as the dense copies make it anyway
    (invariance off)."""

    small: StripMatrix
    large: PackedWeight
    rows: int

    @property
    def shape(self) -> torch.Size:
        return self.large.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.large.dtype

    @property
    def nbytes(self) -> int:
        return self.small.nbytes + self.large.nbytes


BAND_ROWS = 128
"""`BandedWeight`'s split: at 64 rows the tiles still won on three of five shapes; at 128 they
won on two (0.74x, 0.98x) and lost on three (1.1-1.6x) (bench/results/bf16_rows_amx.md)."""

Weight = Tensor | PackedWeight | StripMatrix | BandedWeight


def strip_form(weight: Tensor, dtype: torch.dtype) -> StripMatrix | None:
    """`weight` in the layout of `dtype`'s strip kernel where that kernel takes it, else None
    (the plan leaves it to oneDNN)."""
    if dtype is torch.bfloat16 and bf16_rows.takes(weight):
        return StripWeight.pack(weight)
    if dtype is torch.float32 and f32_rows.takes(weight) and f32_rows.available():
        return F32StripWeight.pack(weight)
    return None


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def reorders(dtype: torch.dtype) -> bool:
    """Whether oneDNN reorders (and multiplies) weights of `dtype` here. Not bf16 on a CPU with
    neither AVX512-BW/VL/DQ nor AVX-NE-CONVERT (the pool's AVX2-only class): torch refuses the
    reorder there, and an engine that packed its dense copies in bf16 failed to start (found
    with every library held to AVX2). Such weights stay plain, for `F.linear`."""
    if not torch.backends.mkldnn.is_available():
        return False
    return dtype is torch.float32 or (
        dtype is torch.bfloat16 and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    )


class Matmul:
    """`linear(x, weight, bias)` as the engine calls it, on weights `prepare` made once.

    Without a plan (invariance off) it is `F.linear` on the loaded weights."""

    def __init__(self, plan: MatmulPlan | None = None) -> None:
        self.plan = plan

    def __repr__(self) -> str:
        return f"Matmul({self.plan.name if self.plan else 'F.linear'})"

    def prepare(self, weight: Tensor) -> Weight:
        """The form of `weight` its calls take: reordered (and split) for a packed plan."""
        plan = self.plan
        weight = weight.detach()
        strips = strip_form(weight, plan.strips) if plan is not None and plan.strips else None
        if strips is not None:
            return strips
        if plan is None or not plan.packed or not reorders(weight.dtype):
            return weight
        in_features = weight.shape[1]
        size = in_features
        if plan.k_chunk and in_features > plan.k_chunk:
            parts = _ceil_div(in_features, plan.k_chunk)
            size = _ceil_div(_ceil_div(in_features, parts), 64) * 64
        spans = tuple(
            (start, min(start + size, in_features)) for start in range(0, in_features, size)
        )
        reorder = torch.ops.mkldnn._reorder_linear_weight
        return PackedWeight(
            parts=tuple(reorder(weight[:, a:b].contiguous(), 32) for a, b in spans),
            spans=spans,
            shape=weight.shape,
        )

    def __call__(self, x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
        plan = self.plan
        if plan is None:
            assert isinstance(weight, Tensor)
            return F.linear(x, weight, bias)
        if isinstance(weight, StripMatrix):
            return weight.matmul(x, bias)
        rows = x.shape[0]
        min_rows = plan.min_rows if weight.shape[1] > plan.min_rows_k else 1
        if plan.row_tile is not None and rows > plan.row_tile:
            out = x.new_empty(rows, weight.shape[0])
            for start in range(0, rows, plan.row_tile):
                tile = x[start : start + plan.row_tile]
                out[start : start + tile.shape[0]] = self._padded(tile, weight, bias, min_rows)
            return out
        return self._padded(x, weight, bias, min_rows)

    def _padded(self, x: Tensor, weight: Weight, bias: Tensor | None, min_rows: int) -> Tensor:
        rows = x.shape[0]
        if rows >= min_rows:
            return self._call(x, weight, bias)
        padded = x.new_zeros(min_rows, x.shape[1])
        padded[:rows] = x
        return self._call(padded, weight, bias)[:rows]

    @staticmethod
    def _call(x: Tensor, weight: Weight, bias: Tensor | None) -> Tensor:
        return multiply(x, weight, bias)


PACKED = MatmulPlan("oneDNN on weights reordered once", packed=True, invariant=False)
"""oneDNN's inner product on a weight reordered into its blocked layout at start-up, rather than
`F.linear` on the plain weight, which oneDNN reorders on every call: bitwise the same products,
measured on the AMD EPYC (bf16, 2 threads, 30 gate-up matrices in turn) 1.9x faster at 1 row,
1.7x at 32, 1.1x at 512 (the reorder is a pass over the weight a call saves)."""


STRIPS_FAST = MatmulPlan(
    "bf16: the own strip kernel, others oneDNN on weights reordered once",
    packed=True,
    strips=torch.bfloat16,
    invariant=False,
)
"""`PACKED` with the strip kernel where `BF16_STRIPS` would take it: as fast as oneDNN from 128
rows and up to 3x faster for few rows on an AMD EPYC (ops/bf16_rows.py), so a forward without
invariance takes it too. On AMX's tiles 0.37-0.86x oneDNN's whole calls up to 32 rows, but up
to 1.6x at 128-512 rows on the wider shapes (bench/results/bf16_rows_amx.md): a prompt pays for
what every decode step gains."""
FP32_STRIPS_FAST = MatmulPlan(
    "fp32: the own strip kernel", packed=True, strips=torch.float32, invariant=False
)
"""`FP32_STRIPS` for a forward without invariance: `PACKED`, oneDNN's float32 inner product,
reads a lone row's weights at 0.43-0.81x the kernel's rate and is no faster at 512
rows (bench/results/f32_rows.md), so nothing is gained by leaving the chain for speed."""


def fastest(dtype: torch.dtype, device: torch.device, flags: frozenset[str]) -> Matmul:
    """The matmul for a forward that keeps no batch invariance: `PACKED` where oneDNN runs
    this dtype on this device (`STRIPS_FAST` or `FP32_STRIPS_FAST` where the CPU class's plan
    takes a strip kernel), `F.linear` elsewhere."""
    if (
        device.type == "cpu"
        and torch.backends.mkldnn.is_available()
        and dtype in (torch.float32, torch.bfloat16)
    ):
        plan = plan_for(dtype, flags)
        if plan is FP32_STRIPS:
            return Matmul(FP32_STRIPS_FAST)
        return Matmul(STRIPS_FAST if plan is BF16_STRIPS else PACKED)
    return Matmul()


def pack(weight: Tensor) -> Weight:
    """`weight` reordered once for `multiply` (`PACKED`); as it is where oneDNN is missing. A
    bf16 matrix the strip kernel takes on AMX tiles: banded (`BandedWeight`), the strips for
    calls of fewer than `BAND_ROWS` rows."""
    if not torch.backends.mkldnn.is_available() or weight.device.type != "cpu":
        return weight.detach()
    packed = Matmul(PACKED).prepare(weight)
    if isinstance(packed, PackedWeight) and banded(weight.dtype) and bf16_rows.takes(weight):
        return BandedWeight(StripWeight.pack(weight), packed, BAND_ROWS)
    return packed


def banded(dtype: torch.dtype) -> bool:
    """Whether `pack` keeps `dtype` matrices in two forms here (`BandedWeight`)."""
    return dtype is torch.bfloat16 and bf16_rows.available() and bf16_rows.tiles()


def multiply(x: Tensor, weight: Weight, bias: Tensor | None = None) -> Tensor:
    """`x @ weight.T + bias` on a plain, a packed or a strip weight, one call per packed part."""
    if isinstance(weight, Tensor):
        return F.linear(x, weight, bias)
    if isinstance(weight, StripMatrix):
        return weight.matmul(x, bias)
    if isinstance(weight, BandedWeight):
        return multiply(x, weight.small if x.shape[0] < weight.rows else weight.large, bias)
    linear = torch.ops.mkldnn._linear_pointwise
    out: Tensor | None = None
    for (start, end), part in zip(weight.spans, weight.parts):
        chunk = x if len(weight.parts) == 1 else x[:, start:end]
        y = linear(chunk, part, bias if out is None else None, "none", [], "")
        out = y if out is None else out.add_(y)
    assert out is not None
    return out
