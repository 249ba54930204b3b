"""The in-place decode kernel (engine/ops/paged_decode.py) on what the kernel tests do not
cover: sliding windows, soft-capped scores, a query group per KV head of any size, blocks in
any order, and the property batch invariance leans on, that a sequence's output does not depend
on what shares its call (nor on how its heads were split between threads)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from trio_llm.engine.ops import paged_decode
from trio_llm.kernels import decode_attention_ref

pytestmark = pytest.mark.skipif(
    paged_decode.extension() is None, reason="the in-place decode kernel needs a C++ compiler"
)

BLOCK = 16


def case(
    lens: list[int], heads: int, kv_heads: int, dim: int, dtype: torch.dtype, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """Queries, caches with each sequence's blocks scattered in a shuffled order, tables and
    lengths."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // BLOCK) for n in lens)
    num_blocks = len(lens) * width + 3
    order = torch.randperm(num_blocks, generator=gen)
    tables = order[: len(lens) * width].view(len(lens), width).contiguous()
    shape = (num_blocks, BLOCK, kv_heads, dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    q = torch.randn(len(lens), heads, dim, generator=gen).to(dtype)
    return q, k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int64)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "window", "softcap"),
    [(9, 3, 64, 0, None), (8, 8, 128, 0, None), (16, 2, 64, 37, None), (4, 1, 256, 0, 50.0)],
)
def test_it_equals_the_reference_in_float32(
    heads: int, kv_heads: int, dim: int, window: int, softcap: float | None
) -> None:
    lens = [1, 15, 16, 17, 100, 300]
    q, k_cache, v_cache, tables, context = case(lens, heads, kv_heads, dim, torch.float32)
    scale = dim**-0.5
    out = paged_decode.paged_decode(q, k_cache, v_cache, tables, context, scale, softcap, window)
    want = decode_attention_ref(
        q, k_cache, v_cache, tables, context, scale, window=window, softcap=softcap
    )
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_bfloat16_within_its_rounding() -> None:
    q, k_cache, v_cache, tables, context = case([5, 64, 200], 9, 3, 64, torch.bfloat16)
    out = paged_decode.paged_decode(q, k_cache, v_cache, tables, context, 0.125)
    want = decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, context, 0.125)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=1e-2, rtol=1e-2)


def test_a_sequence_of_no_context_gets_zeros() -> None:
    q, k_cache, v_cache, tables, _ = case([20, 20], 4, 2, 64, torch.float32)
    out = paged_decode.paged_decode(q, k_cache, v_cache, tables, torch.tensor([20, 0]), 0.1)
    assert out[0].abs().sum() > 0
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_row_is_the_same_alone_and_in_any_batch(dtype: torch.dtype) -> None:
    """Alone, a sequence's KV heads are split between the threads; in a batch of 32 one task
    computes them all. Bitwise the same either way, and on one thread."""
    lens = [
        int(n) for n in torch.randint(1, 400, (32,), generator=torch.Generator().manual_seed(1))
    ]
    q, k_cache, v_cache, tables, context = case(lens, 9, 3, 64, dtype)
    batched = paged_decode.paged_decode(q, k_cache, v_cache, tables, context, 0.125)
    threads = torch.get_num_threads()
    try:
        for count in sorted({1, 2, threads}):
            torch.set_num_threads(count)
            for b in (0, 7, 31):
                alone = paged_decode.paged_decode(
                    q[b : b + 1], k_cache, v_cache, tables[b : b + 1], context[b : b + 1], 0.125
                )
                assert torch.equal(alone[0], batched[b])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "window", "dtype"),
    [
        (9, 3, 64, 0, torch.float32),
        (9, 3, 64, 0, torch.bfloat16),
        (16, 2, 64, 37, torch.float32),
        (8, 8, 128, 0, torch.float32),
        (5, 1, 80, 70, torch.float32),
    ],
)
def test_a_prompts_queries_in_tiles_equal_each_query_alone(
    heads: int, kv_heads: int, dim: int, window: int, dtype: torch.dtype
) -> None:
    """Batch invariance lays a prompt out as decodes of one sequence, one per position; the
    kernel computes up to 16 of them together, sharing key and value reads between the query
    heads of a KV head. Each query's output must be the same bits as its decode alone, with
    windows that start the queries' contexts at different positions and head groups the
    kernel's blocks of four do not divide."""
    n = 150
    q, k_cache, v_cache, tables, _ = case([n + 20], heads, kv_heads, dim, dtype, seed=3)
    q = torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(4)).to(dtype)
    table = tables.expand(n, -1).contiguous()
    lens = torch.arange(21, n + 21, dtype=torch.int64)
    scale = dim**-0.5
    tiled = paged_decode.paged_decode(q, k_cache, v_cache, table, lens, scale, window=window)
    for i in (0, 1, 15, 16, 17, 63, 64, 65, n - 1):
        alone = paged_decode.paged_decode(
            q[i : i + 1], k_cache, v_cache, table[i : i + 1], lens[i : i + 1], scale, window=window
        )
        assert torch.equal(alone[0], tiled[i]), i
    want = decode_attention_ref(
        q.float(), k_cache.float(), v_cache.float(), table, lens, scale, window=window
    )
    tolerance = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(tiled.float(), want, atol=tolerance, rtol=tolerance)


def test_a_head_size_it_cannot_vectorize_is_left_to_the_torch_path() -> None:
    assert paged_decode.supports(torch.empty(1, BLOCK, 2, 64))
    assert not paged_decode.supports(torch.empty(1, BLOCK, 2, 72))
    assert not paged_decode.supports(torch.empty(1, BLOCK, 2, 64, dtype=torch.int8))


def test_a_builder_killed_mid_build_does_not_hang_the_next_engine() -> None:
    """torch's builder locks with a plain file; one killed mid-build (Ctrl-C, a test timeout)
    leaves it behind, and the next engine used to wait on it forever in its first step."""
    (paged_decode.build_directory() / "lock").touch()
    done = subprocess.run(
        [sys.executable, "-m", "trio_llm.engine.ops.paged_decode"],
        capture_output=True,
        text=True,
        timeout=240,
        check=True,
    )
    assert "built in" in done.stdout
    assert not (paged_decode.build_directory() / "lock").exists()
