"""The row-exact 4- and 8-bit matmul (engine/ops/int4_rows.py): a row's result is the same bits at
every row count, on each instruction path this machine has, and it is the dequantized
weight's product in value."""

from __future__ import annotations

import pytest
import torch

from trio_llm.engine.ops import int4_rows
from trio_llm.engine.quant import quantize_int4, quantize_int8
from trio_llm.engine.quant.weights import Int4Weight, Int8Weight, int8_matmul_exact, split_int8

BF16 = torch.bfloat16

pytestmark = pytest.mark.skipif(
    int4_rows.KERNEL.extension() is None, reason="the row-exact kernel needs a C++ compiler"
)


def paths() -> list[bool]:
    """allow_amx values that reach distinct paths here: AMX, then AVX512-BF16 beside it."""
    return [True, False] if int4_rows.path(True) == "amx" else [True]


@pytest.mark.parametrize("bits", ["4", "8", "8 in groups"])
@pytest.mark.parametrize("n, k", [(96, 64), (200, 128), (64, 256)])
def test_a_row_is_the_same_bits_alone_and_in_any_batch(n: int, k: int, bits: str) -> None:
    gen = torch.Generator().manual_seed(n)
    w = torch.randn(n, k, generator=gen)
    weight: Int4Weight | Int8Weight
    if bits == "4":
        weight = quantize_int4(w, BF16)
    elif bits == "8":
        weight = quantize_int8(w, BF16)
    else:  # GGUF's Q8_0: a scale per 32 inputs (two int4 planes for torch's kernel)
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
        weight = split_int8(q, torch.rand(n, k // 32, generator=gen) / 100, BF16)
    weight.keep_exact()
    assert weight.exact is not None
    x = torch.randn(70, k, generator=gen).to(BF16)
    ext = int4_rows.KERNEL.extension()
    e = weight.exact
    for allow_amx in paths():

        def mm(rows: torch.Tensor, amx: bool = allow_amx) -> torch.Tensor:
            return ext.int4_linear(rows, e.packed, e.scales, e.zeros, e.group, e.rows, amx)

        full = mm(x)
        assert full.shape == (70, e.rows)
        for start, stop in [(0, 1), (5, 6), (3, 5), (0, 16), (16, 33), (40, 70), (69, 70)]:
            assert torch.equal(mm(x[start:stop].contiguous()), full[start:stop]), (start, stop)


def test_the_product_is_the_dequantized_weights_in_value() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = quantize_int4(torch.randn(160, 256, generator=gen), BF16, group=64)
    x = torch.randn(9, 256, generator=gen).to(BF16)
    reference = x.float() @ weight.dequantize().float().t()
    weight.keep_exact()
    out = weight.matmul(x, None)
    assert out.shape == (9, 160) and out.dtype == BF16
    # bf16 output (8 bits) and weights rounded to bf16 once: within a few of its units.
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2 * reference.std())


def test_an_8_bit_matrix_as_two_planes_keeps_its_value() -> None:
    gen = torch.Generator().manual_seed(2)
    q = torch.randint(-128, 128, (100, 128), generator=gen, dtype=torch.int8)
    scale = torch.rand(100, 4, generator=gen) / 100
    weight = split_int8(q, scale, BF16)
    x = torch.randn(7, 128, generator=gen).to(BF16)
    before = weight.matmul(x, None)
    weight.keep_exact()
    assert weight.exact is not None and weight.exact.packed.shape[-1] == 64  # 8 bits, one matrix
    after = weight.matmul(x, None)
    assert after.shape == (7, 100)
    torch.testing.assert_close(
        after.float(), before.float(), rtol=2e-2, atol=2e-2 * before.float().std()
    )


def test_8_bit_rows_keep_their_value() -> None:
    gen = torch.Generator().manual_seed(3)
    weight = quantize_int8(torch.randn(150, 192, generator=gen), BF16)
    x = torch.randn(11, 192, generator=gen).to(BF16)
    reference = x.float() @ weight.dequantize().float().t()
    weight.keep_exact()
    out = weight.matmul(x, None)
    assert out.shape == (11, 150)
    torch.testing.assert_close(out.float(), reference, rtol=2e-2, atol=2e-2 * reference.std())


def test_w8a8_weights_keep_their_integer_matmul_where_it_is_exact() -> None:
    """torch._int_mm is row-exact, and with VNNI exact; without it (the AVX2-only class) its
    sums saturate and the weights take the row-exact kernel instead."""
    weight = quantize_int8(torch.randn(64, 64), BF16, int8_activations=True)
    weight.keep_exact()
    assert (weight.exact is None) == int8_matmul_exact()
