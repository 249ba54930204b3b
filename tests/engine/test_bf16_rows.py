"""The strip kernel for plain bf16 weights (engine/ops/bf16_rows.py): every row of a call is
the bits it has alone, whatever the call's rows, and the values are the matmul's."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trio_llm.engine.ops import bf16_rows
from trio_llm.engine.ops.bf16_rows import StripWeight
from trio_llm.engine.ops.matmul import BF16_STRIPS, Matmul

BF16 = torch.bfloat16

pytestmark = pytest.mark.skipif(
    not bf16_rows.available(), reason="the strip kernel needs a C++ compiler"
)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("n", "k"), [(96, 64), (45, 576), (200, 2100), (33, 2)])
def test_each_row_is_the_same_bits_alone_and_in_any_call(n: int, k: int, threads: int) -> None:
    """Calls of 1 to 40 rows, at every offset into a batch (the kernel passes 12 rows at a
    time, so rows land in every position of a pass and in a short last one)."""
    gen = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=gen).to(BF16)
    x = torch.randn(40, k, generator=gen).to(BF16)
    weight = StripWeight.pack(w)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        alone = torch.cat([weight.matmul(x[i : i + 1]) for i in range(40)])
        for rows in (2, 5, 12, 13, 25, 40):
            for start in (0, 40 - rows):
                got = weight.matmul(x[start : start + rows])
                assert torch.equal(got, alone[start : start + rows]), (rows, start)
    finally:
        torch.set_num_threads(before)


def test_values_are_the_matmul_with_bias_and_unpadded_outputs() -> None:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(45, 576, generator=gen).to(BF16)  # 45 outputs: a strip and a padded one
    x = torch.randn(7, 576, generator=gen).to(BF16)
    bias = torch.randn(45, generator=gen).to(BF16)
    weight = StripWeight.pack(w)
    assert weight.shape == w.shape and weight.dtype == BF16
    assert weight.nbytes == 64 * 576 * 2  # outputs padded to whole strips of 32
    got = weight.matmul(x[:, :].t().contiguous().t(), bias)  # a non-contiguous input too
    want = F.linear(x.float(), w.float(), bias.float())
    assert got.shape == (7, 45) and got.dtype == BF16
    torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=0.25)


def test_the_kernel_takes_bf16_weights_with_an_even_inner_dimension() -> None:
    assert bf16_rows.takes(torch.zeros(4, 64, dtype=BF16))
    assert not bf16_rows.takes(torch.zeros(4, 63, dtype=BF16))
    assert not bf16_rows.takes(torch.zeros(4, 64))


def test_turned_off_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bf16_rows.ENV, "0")
    assert not bf16_rows.available()


def test_the_plan_packs_what_the_kernel_takes_and_leaves_the_rest_to_onednn() -> None:
    plan = Matmul(BF16_STRIPS)
    assert isinstance(plan.prepare(torch.randn(8, 64).to(BF16)), StripWeight)
    odd = plan.prepare(torch.randn(8, 63).to(BF16))
    assert not isinstance(odd, StripWeight)
    x = torch.randn(1, 63).to(BF16)  # a lone row, padded to two for oneDNN
    assert plan(x, odd).shape == (1, 8)
