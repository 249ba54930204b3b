"""The Triton paged-attention kernels against their torch references.

The cases form a pairwise covering of head dim {64, 128} x GQA ratio {1, 3, 8} x cache block size
{16, 32} x dtype {fp32, bf16, fp16}: every pair of values meets in some case, so nine cases per
kernel cover what a full 36-case grid would catch of any fault that two parameters trigger
together. Lengths run from 1 to about 2k, always including the block-boundary neighbours, and
batches from 1 to 64. The interpreter runs each program in Python, so the big cases are few.

Tolerances, on the output against an fp32 reference computed from the same (rounded) inputs:
- fp32: atol = rtol = 1e-4 (ieee dots; only the summation order differs);
- fp16: atol = rtol = 5e-3 (P is rounded to fp16 before the P @ V product, as on tensor cores);
- bf16: atol = rtol = 3e-2 (the same, with bf16's 8-bit mantissa: about 4 ulps at |x| = 1).
Largest errors seen in the interpreter: fp32 1.2e-6, fp16 2.0e-3, bf16 1.6e-2.

The engine's torch attention backend implements the same contract (behind the kernels'
signatures in torch_signatures.py): every test that states the contract (rather than a launch
shape of the kernels) runs on both implementations (`impl`), with the same tolerances.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch
import torch_signatures

from trio_llm import kernels
from trio_llm.engine.ops import paged_decode
from trio_llm.kernels import (
    DecodeConfig,
    PrefillConfig,
    decode_attention,
    decode_attention_ref,
    prefill_attention,
    prefill_attention_ref,
    write_kv,
    write_kv_ref,
)

needs_triton = pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")

TOLERANCE = {
    torch.float32: 1e-4,
    torch.float16: 5e-3,
    torch.bfloat16: 3e-2,
}
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@dataclass(frozen=True)
class Impl:
    """One implementation of the contract: the kernels' three entry points. `config` (a launch
    shape) reaches the kernels only; the torch backend has none."""

    name: str

    def decode(self, *args: object, config: DecodeConfig | None = None) -> torch.Tensor:
        if self.name == "triton":
            return decode_attention(*args, config=config)  # type: ignore[arg-type]
        in_place = self.name == "cpu_kernel"
        return torch_signatures.decode_attention(*args, in_place=in_place)  # type: ignore[arg-type]

    def prefill(self, *args: object, config: PrefillConfig | None = None) -> torch.Tensor:
        if self.name == "triton":
            return prefill_attention(*args, config=config)  # type: ignore[arg-type]
        return torch_signatures.prefill_attention(*args)  # type: ignore[arg-type]

    def write_kv(self, *args: torch.Tensor) -> None:
        (write_kv if self.name == "triton" else torch_signatures.write_kv)(*args)


needs_cpu_kernel = pytest.mark.skipif(
    torch.cuda.is_available() or paged_decode.extension() is None,
    reason="the in-place decode kernel is CPU-only and needs a C++ compiler",
)


@pytest.fixture(
    params=[
        pytest.param("triton", marks=needs_triton),
        "torch",
        pytest.param("cpu_kernel", marks=needs_cpu_kernel),
    ],
    ids=["triton", "torch", "cpu_kernel"],
)
def impl(request: pytest.FixtureRequest) -> Impl:
    return Impl(request.param)


@dataclass
class PagedCache:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor


def make_cache(
    lengths: list[int],
    *,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    device: torch.device,
    gen: torch.Generator,
) -> PagedCache:
    """Random K/V in shuffled blocks, with spare blocks of random garbage the kernels must never
    read, and table columns past each sequence's end pointing far out of bounds."""
    needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(needed) + 3
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    width = max(needed, default=0) + 1
    tables = torch.full((len(lengths), width), 1 << 30, dtype=torch.int32)
    order = torch.randperm(num_blocks, generator=gen)
    used = 0
    for b, n in enumerate(needed):
        tables[b, :n] = order[used : used + n]
        used += n
    return PagedCache(
        k_cache.to(device),
        v_cache.to(device),
        tables.to(device),
        torch.tensor(lengths, dtype=torch.int32, device=device),
    )


def boundary_lengths(block_size: int, count: int, longest: int, gen: torch.Generator) -> list[int]:
    """`count` lengths in [1, longest]: longest, 1, the neighbours of one block's end, random."""
    fixed = [longest, 1, block_size - 1, block_size, block_size + 1]
    rand = torch.randint(1, longest + 1, (max(0, count - len(fixed)),), generator=gen).tolist()
    return (fixed + rand)[:count]


def assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()
    tol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


# (head_dim, group, block_size, dtype, batch, longest, num_kv_heads): pairwise covering, above.
CASES = [
    pytest.param(64, 1, 16, F32, 5, 300, 2, id="d64-g1-bs16-f32"),
    pytest.param(128, 1, 32, BF16, 2, 2047, 1, id="d128-g1-bs32-bf16-long"),
    pytest.param(64, 1, 32, F16, 16, 200, 1, id="d64-g1-bs32-f16"),
    pytest.param(128, 3, 16, F32, 3, 130, 1, id="d128-g3-bs16-f32"),
    pytest.param(64, 3, 32, BF16, 7, 400, 3, id="d64-g3-bs32-bf16-smollm2"),
    pytest.param(128, 3, 32, F16, 1, 1000, 2, id="d128-g3-bs32-f16"),
    pytest.param(64, 8, 32, F32, 64, 1024, 1, id="d64-g8-bs32-f32-batch64"),
    pytest.param(128, 8, 16, BF16, 5, 97, 1, id="d128-g8-bs16-bf16"),
    pytest.param(64, 8, 16, F16, 9, 600, 1, id="d64-g8-bs16-f16"),
]


@pytest.mark.parametrize(
    ("head_dim", "group", "block_size", "dtype", "batch", "longest", "num_kv_heads"), CASES
)
def test_decode_matches_reference(
    impl: Impl,
    device: torch.device,
    head_dim: int,
    group: int,
    block_size: int,
    dtype: torch.dtype,
    batch: int,
    longest: int,
    num_kv_heads: int,
) -> None:
    gen = torch.Generator().manual_seed(head_dim * 1000 + group * 100 + batch)
    config = None  # the launch shape decode_config picks
    if batch == 64:
        # The batch-64 case: short contexts but for a few, and two splits rather than the
        # heuristic's nine; the interpreter pays ~20 ms for every program, even an empty one.
        lengths = boundary_lengths(block_size, 8, longest, gen)
        lengths += torch.randint(1, 65, (batch - len(lengths),), generator=gen).tolist()
        config = DecodeConfig(num_splits=2)
    else:
        lengths = boundary_lengths(block_size, batch, longest, gen)
    cache = make_cache(
        lengths,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        gen=gen,
    )
    q = torch.randn(batch, num_kv_heads * group, head_dim, generator=gen).to(dtype).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = impl.decode(*args, head_dim**-0.5, config=config)
    assert_matches(out, decode_attention_ref(*args, head_dim**-0.5))


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(DecodeConfig(num_splits=1), id="one-split"),
        pytest.param(DecodeConfig(num_splits=7, block_n=16), id="uneven-splits"),
        pytest.param(DecodeConfig(num_splits=24, block_n=32), id="more-splits-than-tiles"),
        pytest.param(DecodeConfig(num_splits=3, block_n=128), id="wide-tiles"),
    ],
)
@needs_triton
def test_decode_any_split_gives_the_same_answer(device: torch.device, config: DecodeConfig) -> None:
    """Flash-decoding's reduce must merge partials exactly, including splits that are empty for
    short sequences, and the context padding entry (length 0) must come out as zeros."""
    gen = torch.Generator().manual_seed(7)
    lengths = [0, 1, 33, 700]
    cache = make_cache(
        lengths, num_kv_heads=2, head_dim=64, block_size=16, dtype=F32, device=device, gen=gen
    )
    q = torch.randn(len(lengths), 6, 64, generator=gen).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = decode_attention(*args, 0.125, config=config)
    assert_matches(out, decode_attention_ref(*args, 0.125))
    assert (out[0] == 0).all()


def test_a_padding_sequence_decodes_to_zeros(impl: Impl, device: torch.device) -> None:
    """A context of 0 (batch padding) gives zeros, beside sequences that attend."""
    gen = torch.Generator().manual_seed(8)
    lengths = [0, 1, 33]
    cache = make_cache(
        lengths, num_kv_heads=2, head_dim=64, block_size=16, dtype=F32, device=device, gen=gen
    )
    q = torch.randn(len(lengths), 6, 64, generator=gen).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    out = impl.decode(*args, 0.125)
    assert_matches(out, decode_attention_ref(*args, 0.125))
    assert (out[0] == 0).all()


def chunk_lengths(contexts: list[int], gen: torch.Generator) -> list[int]:
    """Query chunk per sequence, in turn: the whole prompt (its last 160 tokens when longer, a
    chunk after a cached prefix), a single token, or a random chunk."""
    q_lens = []
    for i, ctx in enumerate(contexts):
        if i % 3 == 0:
            q_lens.append(min(ctx, 160))
        elif i % 3 == 1:
            q_lens.append(1)
        else:
            q_lens.append(int(torch.randint(1, min(ctx, 160) + 1, (), generator=gen)))
    return q_lens


@pytest.mark.parametrize(
    ("head_dim", "group", "block_size", "dtype", "batch", "longest", "num_kv_heads"), CASES
)
def test_prefill_matches_reference(
    impl: Impl,
    device: torch.device,
    head_dim: int,
    group: int,
    block_size: int,
    dtype: torch.dtype,
    batch: int,
    longest: int,
    num_kv_heads: int,
) -> None:
    gen = torch.Generator().manual_seed(head_dim * 1000 + group * 100 + batch + 1)
    # Prefill runs on fewer sequences than decode (its cost grows with q_len x context).
    lengths = boundary_lengths(block_size, min(batch, 6), longest, gen)
    q_lens = chunk_lengths(lengths, gen)
    cache = make_cache(
        lengths,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        block_size=block_size,
        dtype=dtype,
        device=device,
        gen=gen,
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), num_kv_heads * group, head_dim, generator=gen).to(dtype)
    args = (q.to(device), cache.k_cache, cache.v_cache, cache.block_tables, cu.to(device))
    # The batch-64 case takes the 16-bit launch shape (128-row tiles): fp32's 32 x 32 tiles with
    # 8 heads per KV head would cost the interpreter a minute; other fp32 cases use them.
    config = PrefillConfig() if batch == 64 else None
    out = impl.prefill(*args, cache.context_lens, head_dim**-0.5, config=config)
    assert_matches(out, prefill_attention_ref(*args, cache.context_lens, head_dim**-0.5))


def test_prefill_tiles_narrower_than_a_group(impl: Impl, device: torch.device) -> None:
    """With 32 query heads per KV head a 16-row tile holds less than one token's heads: the
    kernel must widen its tile to the group, and small tiles must still cover every token."""
    gen = torch.Generator().manual_seed(3)
    lengths = [40, 5]
    q_lens = [17, 5]
    cache = make_cache(
        lengths, num_kv_heads=1, head_dim=64, block_size=16, dtype=F32, device=device, gen=gen
    )
    cu = torch.tensor([0, 17, 22], dtype=torch.int32, device=device)
    q = torch.randn(sum(q_lens), 32, 64, generator=gen).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cu, cache.context_lens, 0.125)
    out = impl.prefill(*args, config=PrefillConfig(block_m=16, block_n=16))
    assert_matches(out, prefill_attention_ref(*args))


@pytest.mark.parametrize("head_dim", [16, 80])
def test_head_dims_off_the_grid(impl: Impl, device: torch.device, head_dim: int) -> None:
    """16 (the test suite's tiny model) is the smallest a tensor-core dot takes; 80 is not a power
    of two, so the kernels pad to 128 and mask the tail of every load and store."""
    gen = torch.Generator().manual_seed(head_dim)
    lengths = [1, 20, 77]
    cache = make_cache(
        lengths, num_kv_heads=2, head_dim=head_dim, block_size=16, dtype=F32, device=device, gen=gen
    )
    scale = head_dim**-0.5
    q = torch.randn(len(lengths), 4, head_dim, generator=gen).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    assert_matches(impl.decode(*args, scale), decode_attention_ref(*args, scale))
    cu = torch.tensor([0, 1, 11, 41], dtype=torch.int32, device=device)
    qp = torch.randn(41, 4, head_dim, generator=gen).to(device)
    pargs = (qp, cache.k_cache, cache.v_cache, cache.block_tables, cu, cache.context_lens, scale)
    assert_matches(impl.prefill(*pargs), prefill_attention_ref(*pargs))


def test_decode_is_prefill_with_one_query(impl: Impl, device: torch.device) -> None:
    dtype = BF16
    gen = torch.Generator().manual_seed(11)
    lengths = [1, 16, 17, 250, 513]
    cache = make_cache(
        lengths, num_kv_heads=3, head_dim=64, block_size=16, dtype=dtype, device=device, gen=gen
    )
    q = torch.randn(len(lengths), 9, 64, generator=gen).to(dtype).to(device)
    cu = torch.arange(len(lengths) + 1, dtype=torch.int32, device=device)
    common = (cache.k_cache, cache.v_cache, cache.block_tables)
    decoded = impl.decode(q, *common, cache.context_lens, 0.125)
    prefilled = impl.prefill(q, *common, cu, cache.context_lens, 0.125)
    # Same function, different tiling and split order: equal up to summation order.
    assert_matches(decoded, prefilled)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_write_kv_stores_by_slot_and_skips_padding(
    impl: Impl, device: torch.device, dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(5)
    num_blocks, block_size, num_kv_heads, head_dim = 6, 16, 3, 64
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    v_cache = torch.randn(shape, generator=gen).to(dtype).to(device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:40]
    slots[[0, 13, 39]] = -1
    # key and value as strided views of one fused QKV projection, as the model produces them.
    qkv = torch.randn(40, 3 * num_kv_heads, head_dim, generator=gen).to(dtype).to(device)
    key, value = qkv[:, num_kv_heads : 2 * num_kv_heads], qkv[:, 2 * num_kv_heads :]
    expect_k, expect_v = k_cache.clone(), v_cache.clone()
    write_kv_ref(key, value, expect_k, expect_v, slots.to(device))
    impl.write_kv(key, value, k_cache, v_cache, slots.to(device))
    assert torch.equal(k_cache, expect_k) and torch.equal(v_cache, expect_v)


@needs_triton
def test_runs_where_expected(device: torch.device) -> None:
    """On CPU the kernels must really run in the interpreter (not fall back to anything), and on
    a GPU they must be compiled."""
    from trio_llm.kernels import _loader

    assert _loader.interpreted() == (device.type == "cpu")


@needs_triton
def test_shape_errors_name_the_fault(device: torch.device) -> None:
    cache = torch.zeros(2, 16, 2, 64, device=device)
    tables = torch.zeros(1, 2, dtype=torch.int32, device=device)
    lens = torch.ones(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="not a multiple"):
        decode_attention(torch.zeros(1, 3, 64, device=device), cache, cache, tables, lens, 1.0)
    with pytest.raises(TypeError, match="q is"):
        q = torch.zeros(1, 4, 64, dtype=BF16, device=device)
        decode_attention(q, cache, cache, tables, lens, 1.0)
    with pytest.raises(TypeError, match="int32 or int64"):
        decode_attention(
            torch.zeros(1, 4, 64, device=device), cache, cache, tables, lens.float(), 1.0
        )


def test_scale_is_applied(impl: Impl, device: torch.device) -> None:
    """A guard on the log2 folding: a large scale must sharpen the softmax like the reference."""
    gen = torch.Generator().manual_seed(2)
    cache = make_cache(
        [50], num_kv_heads=1, head_dim=64, block_size=16, dtype=F32, device=device, gen=gen
    )
    q = torch.randn(1, 1, 64, generator=gen).to(device)
    args = (q, cache.k_cache, cache.v_cache, cache.block_tables, cache.context_lens)
    for scale in (math.sqrt(64), 1e-3):
        assert_matches(impl.decode(*args, scale), decode_attention_ref(*args, scale))


@needs_triton
def test_triton_imported_before_the_interpreter_setting_is_refused(device: torch.device) -> None:
    """If something imported Triton before TRITON_INTERPRET was settled, Triton's own library is
    compiled-mode while our kernels would be interpreted, and bf16 math silently breaks: loading
    must fail with a message that says what to do instead."""
    if device.type != "cpu":
        pytest.skip("only a process without a GPU interprets")
    code = (
        "import os, triton\n"
        "os.environ.pop('TRITON_INTERPRET', None)\n"
        "from trio_llm.kernels import KernelUnavailableError, _loader\n"
        "try:\n"
        "    _loader.load_triton()\n"
        "except KernelUnavailableError as e:\n"
        "    print('refused:', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert "refused: Triton was imported before TRITON_INTERPRET" in result.stdout, result.stderr
