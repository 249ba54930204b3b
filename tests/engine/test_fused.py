"""The fused elementwise kernels of a decoder layer (engine/ops/fused.py): the values of
transformers' formulas, each row computed from its own values alone, and an own forward that
predicts with them what it predicts with eager torch ops."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from engine_helpers import make_core, random_prompts, request, run

from trio_llm.engine.models.llama import _rms_norm, _rotate
from trio_llm.engine.ops import fused

BF16 = torch.bfloat16

pytestmark = pytest.mark.skipif(
    fused.KERNEL.extension() is None and shutil.which("c++") is None,
    reason="the fused kernels need a C++ compiler",
)


def test_the_kernels_build_wherever_a_compiler_is() -> None:
    assert fused.KERNEL.extension() is not None


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
@pytest.mark.parametrize("n", [576, 100])  # 100: a last block of 4 lanes
def test_add_rms_norm_is_the_residual_add_and_transformers_norm(dtype: torch.dtype, n: int) -> None:
    gen = torch.Generator().manual_seed(n)
    x = (torch.randn(9, n, generator=gen) * 3).to(dtype)
    out = torch.randn(9, n, generator=gen).to(dtype)
    weight = torch.rand(n, generator=gen).to(dtype)
    expected_x = x + out
    expected = _rms_norm(expected_x, weight, 1e-5)
    h = fused.add_rms_norm(x, out, weight, 1e-5)
    assert torch.equal(x, expected_x)  # in place, the sum rounded as torch rounds it
    # The mean of squares summed in another order: a unit of the last place at most.
    tol = 1e-2 if dtype is BF16 else 1e-6
    torch.testing.assert_close(h.float(), expected.float(), rtol=tol, atol=tol)
    alone = fused.add_rms_norm(x.clone(), None, weight, 1e-5)
    assert torch.equal(alone, h)  # without `out`: the norm of x as it is


def test_the_residual_rounds_as_torch_rounds_denormals_and_nans() -> None:
    """Where the CPU has AVX512-BF16 the kernels round by `vcvtneps2bf16`, which reads a
    denormal as zero; a vector holding one rounds by integer arithmetic, as torch does."""
    n = 64
    x = torch.randn(3, n, generator=torch.Generator().manual_seed(3)).to(BF16)
    x[0, 5] = 1e-39  # a bf16 denormal, and its negative
    x[0, 40] = -3e-39
    x[1, 7] = float("nan")
    x[1, 8] = float("inf")
    out = torch.zeros(3, n, dtype=BF16)
    out[2] = x[2] * -1 + torch.full((n,), 2e-39, dtype=BF16)  # sums cancelling to denormals
    expected = x + out
    fused.add_rms_norm(x, out, torch.ones(n, dtype=BF16), 1e-5)
    assert torch.isnan(x[1, 7]) and x[1, 8].item() == float("inf")
    x[1, 7] = expected[1, 7] = 0  # a NaN's payload is torch's own choice (its vector add's)
    assert torch.equal(x.view(torch.int16), expected.view(torch.int16))
    assert x[0, 5].item() != 0.0


def test_a_row_is_the_same_bits_alone_and_in_any_batch() -> None:
    gen = torch.Generator().manual_seed(5)
    rows, n = 40, 576
    x = torch.randn(rows, n, generator=gen).to(BF16)
    out = torch.randn(rows, n, generator=gen).to(BF16)
    weight = torch.rand(n, generator=gen).to(BF16)
    gate_up = (torch.randn(rows, 2 * n, generator=gen) * 4).to(BF16)
    cos, sin = (
        torch.randn(64, 64, generator=gen).to(BF16),
        torch.randn(64, 64, generator=gen).to(BF16),
    )
    positions = torch.randint(0, 64, (rows,), generator=gen)
    qkv = torch.randn(rows, 15 * 64, generator=gen).to(BF16)
    batch_x = x.clone()
    batch_h = fused.add_rms_norm(batch_x, out, weight, 1e-5)
    batch_act = fused.silu_mul(gate_up)
    batch_qkv = qkv.clone()
    fused.rotate_(batch_qkv, 12, 64, cos, sin, positions)
    for r in [0, 7, 39]:
        one = x[r : r + 1].clone()
        assert torch.equal(
            fused.add_rms_norm(one, out[r : r + 1], weight, 1e-5), batch_h[r : r + 1]
        )
        assert torch.equal(one, batch_x[r : r + 1])
        assert torch.equal(fused.silu_mul(gate_up[r : r + 1]), batch_act[r : r + 1])
        row = qkv[r : r + 1].clone()
        fused.rotate_(row, 12, 64, cos, sin, positions[r : r + 1])
        assert torch.equal(row, batch_qkv[r : r + 1])


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_rotate_rotates_queries_and_keys_in_place_and_leaves_values(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    tokens, heads, d = 6, 12, 64
    qkv = torch.randn(tokens, (heads + 3) * d, generator=gen).to(dtype)
    cos = torch.cos(torch.randn(100, d, generator=gen)).to(dtype)
    sin = torch.sin(torch.randn(100, d, generator=gen)).to(dtype)
    positions = torch.randint(0, 100, (tokens,), generator=gen)
    expected = _rotate(
        qkv[:, : heads * d].view(tokens, heads, d), cos[positions, None], sin[positions, None]
    )
    rotated = qkv.clone()
    fused.rotate_(rotated, heads, d, cos, sin, positions)
    # One rounding where eager bf16 rounds three times: within two of its units.
    tol = 2e-2 if dtype is BF16 else 1e-6
    torch.testing.assert_close(
        rotated[:, : heads * d].view(tokens, heads, d).float(), expected.float(), rtol=tol, atol=tol
    )
    assert torch.equal(rotated[:, heads * d :], qkv[:, heads * d :])
    with pytest.raises(RuntimeError, match="position"):
        fused.rotate_(rotated, heads, d, cos, sin, torch.full((tokens,), 100))


@pytest.mark.parametrize("dtype", [BF16, torch.float32])
def test_silu_mul_is_silu_of_the_gate_times_up(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    gate_up = (torch.randn(5, 2 * 1000, generator=gen) * 8).to(dtype)  # large |gate| both ways
    expected = F.silu(gate_up[:, :1000]) * gate_up[:, 1000:]
    tol = 1e-2 if dtype is BF16 else 1e-5
    torch.testing.assert_close(
        fused.silu_mul(gate_up).float(), expected.float(), rtol=tol, atol=tol
    )


def test_the_forward_predicts_the_same_with_fused_and_eager_ops(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """float32, where the two differ by float32 rounding only: the same greedy tokens."""
    prompts = random_prompts([5, 33, 70], seed=3, vocab=200)
    reqs = [request(str(i), p, max_tokens=8) for i, p in enumerate(prompts)]
    core = make_core(tiny_model_dir, dtype="float32", device="cpu", enable_prefix_caching=False)
    with_fused = run(core, reqs)
    monkeypatch.setenv(fused.ENV, "0")
    eager = run(core, [request(f"e{r.request_id}", r.prompt_token_ids, max_tokens=8) for r in reqs])
    for r in reqs:
        assert with_fused[r.request_id].token_ids == eager[f"e{r.request_id}"].token_ids
