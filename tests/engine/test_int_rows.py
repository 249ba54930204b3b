"""The integer row-exact matmul (engine/ops/int_rows.py): every path it has (AVX512-VNNI,
scalar) gives the same bits, so a row's result does not depend on how many rows
share its call or which path the call took; and its value is the integer formula's, close to
the dequantized weight's product."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from trio_llm.engine.ops import int4_rows, int_rows, row_exact
from trio_llm.engine.ops.int4_rows import RowsExact
from trio_llm.engine.ops.int_rows import IntRows
from trio_llm.engine.quant import quantize_int4, quantize_int8
from trio_llm.engine.quant.weights import Int4Weight, Int8Weight, split_int8

BF16 = torch.bfloat16

COMPILER = shutil.which("c++") is not None
pytestmark = pytest.mark.skipif(
    int_rows.KERNEL.extension() is None and not COMPILER,
    reason="the integer kernel needs a C++ compiler",
)


def test_the_kernel_builds_wherever_a_compiler_is() -> None:
    """A kernel that fails to compile would leave every test below skipped and the engine on
    torch's kernels: with a compiler here, it must build."""
    assert int_rows.KERNEL.extension() is not None


PATHS = {name: {"best": name} for name in int_rows.PATHS}
"""Each path up to which a call may go: the fastest built here up to it (VNNI, AVX2, scalar)."""


def weight_of(bits: str, n: int, k: int, gen: torch.Generator) -> Int4Weight | Int8Weight:
    w = torch.randn(n, k, generator=gen)
    if bits == "4":
        return quantize_int4(w, BF16)
    if bits == "4 in groups of 64":
        return quantize_int4(w, BF16, group=64)
    if bits == "8":
        return quantize_int8(w, BF16)
    # GGUF's Q8_0: a scale per 32 inputs (two int4 planes for torch's kernel)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    return split_int8(q, torch.rand(n, k // 32, generator=gen) / 100, BF16)


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("bits", ["4", "4 in groups of 64", "8", "8 in groups"])
@pytest.mark.parametrize("n, k", [(96, 64), (200, 128), (64, 256)])
def test_every_path_and_row_count_gives_the_same_bits(
    n: int, k: int, bits: str, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(n + k)
    weight = weight_of(bits, n, k, gen)
    weight.keep_exact(IntRows)
    e = weight.exact
    assert isinstance(e, IntRows)
    x = (torch.randn(70, k, generator=gen) * torch.rand(70, 1, generator=gen) * 4).to(dtype)
    x[3, :32] = 0  # a block of zeros: scale 0, no NaN
    outs = {name: e.matmul(x, **kw) for name, kw in PATHS.items()}
    full = outs["generic"]
    assert full.shape == (70, n) and full.dtype == dtype and torch.isfinite(full).all()
    for name, out in outs.items():
        assert torch.equal(out, full), name
    for start, stop in [(0, 1), (5, 6), (3, 5), (0, 16), (16, 33), (31, 64), (69, 70)]:
        for name, kw in PATHS.items():
            assert torch.equal(e.matmul(x[start:stop], **kw), full[start:stop]), (name, start)


def reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor
) -> torch.Tensor:
    """The kernel's formula in torch, float64: rows quantized per block of 32 by max|x| / 127,
    integer sums per block, w = (q - 8) * scale + zero."""
    m, k = x.shape
    blocks = x.float().view(m, k // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    xq = torch.where(amax > 0, torch.round(blocks * (127 / amax)), 0.0)
    d = (amax / 127).double()
    group = k // scale.shape[1]
    w = (
        (q.double() - 8) * scale.double().repeat_interleave(group, 1)
    ) + zero.double().repeat_interleave(group, 1)
    return torch.einsum("mbk,nbk,mb->mn", xq.double(), w.view(-1, k // 32, 32), d[..., 0])


def test_the_value_is_the_integer_formula_and_near_the_dequantized_product() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = quantize_int4(torch.randn(160, 256, generator=gen), BF16, group=64)
    x = torch.randn(9, 256, generator=gen).to(BF16)
    q, scale, zero = weight.values()
    weight.keep_exact(IntRows)
    out = weight.matmul(x, None)
    assert out.shape == (9, 160) and out.dtype == BF16
    exact = reference(x, q[:160], scale[:160].float(), zero[:160].float())
    # The float ops differ from float64's only by rounding; the output is bf16 (8 bits).
    torch.testing.assert_close(out.double(), exact, rtol=1e-2, atol=1e-2 * exact.std().item())
    # int8 activations cost about 1% of a product's spread against bf16 ones.
    dense = F.linear(x.float(), weight.dequantize().float())
    err = (out.float() - dense).abs().max() / dense.std()
    assert err < 0.05, err


def test_an_8_bit_matrix_keeps_its_value() -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randint(-128, 128, (100, 128), generator=gen, dtype=torch.int8)
    weight = split_int8(q, torch.rand(100, 4, generator=gen) / 100, BF16)
    x = torch.randn(7, 128, generator=gen).to(BF16)
    before = weight.matmul(x, None)
    weight.keep_exact(IntRows)
    assert isinstance(weight.exact, IntRows) and weight.exact.eight
    after = weight.matmul(x, None)
    torch.testing.assert_close(
        after.float(), before.float(), rtol=3e-2, atol=3e-2 * before.float().std()
    )


@pytest.mark.parametrize(
    ("float_path", "int_path", "invariant", "dtype", "kernel"),
    [
        ("amx", "vnni", False, BF16, IntRows),  # AMX: the integer kernel, invariance or not
        ("amx", "vnni", True, torch.float32, IntRows),  # it takes float32 rows too
        ("amx", None, True, BF16, RowsExact),  # no integer kernel: the float one for invariance
        ("amx", None, False, BF16, None),  # ... and torch's without (its lone row is slower)
        ("avx512_bf16", "vnni", False, BF16, IntRows),  # AVX512-BF16 without AMX: VNNI too
        ("avx512_bf16", "vnni", True, torch.float32, IntRows),
        ("avx512_bf16", None, False, BF16, RowsExact),  # no integer kernel: the float one
        ("avx512_bf16", None, True, torch.float32, None),  # ... which takes bf16 rows only
        ("generic", "avx2", False, BF16, IntRows),  # AVX2 alone: the integer kernel too
        ("generic", "avx2", True, torch.float32, IntRows),
        ("generic", "generic", True, BF16, None),  # no AVX2: torch's
        ("avx512_bf16", "generic", True, BF16, RowsExact),  # the integer kernel's scalar path
        ("amx", "vnni", False, torch.float16, None),  # float16 rows: neither
    ],
)
def test_each_cpu_class_takes_the_kernel_measured_there(
    monkeypatch: pytest.MonkeyPatch,
    float_path: str,
    int_path: str | None,
    invariant: bool,
    dtype: torch.dtype,
    kernel: type | None,
) -> None:
    monkeypatch.setattr(int4_rows, "path", lambda allow_amx=True: float_path)
    monkeypatch.setattr(int_rows, "path", lambda best="vnni": int_path)
    assert row_exact.kernel(invariant, dtype) is kernel


@pytest.mark.parametrize(
    ("float_path", "int_path", "free"),
    [
        ("avx512_bf16", "vnni", True),
        ("avx512_bf16", None, True),
        ("amx", "vnni", False),
        ("generic", "avx2", True),
        ("generic", "generic", False),
    ],
)
def test_auto_keeps_invariance_only_where_its_price_was_measured_small(
    monkeypatch: pytest.MonkeyPatch, float_path: str, int_path: str, free: bool
) -> None:
    """On an AMX machine the integer kernel makes decode steps nearly free with invariance but a
    prefill 1.7-2.2x as long (bench/results/step_profile_amx_attention.md): `auto` keeps it off
    there. Without AMX nothing beats the row-exact kernel on a prompt's rows, whichever it is,
    and a prompt's queries share the keys they read: on AVX2 alone a prefill costs 1.03-1.07x
    (bench/results/step_profile_avx2.md)."""
    monkeypatch.setattr(int4_rows, "path", lambda allow_amx=True: float_path)
    monkeypatch.setattr(int_rows, "path", lambda best="vnni": int_path)
    assert row_exact.invariance_free(BF16) is free
