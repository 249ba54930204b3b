"""The bf16 attention kernel (engine/ops/paged_amx.py): each query over its own paged context,
equal to the reference within bf16's rounding, and the property batch invariance leans on: a
query's row is the same bits as a decode alone, in a prefill of any chunking, in a batch of
other sequences (whose runs pack several KV heads a task), and on any number of threads. It
runs on AMX's bf16 tiles (an Intel Xeon of the AMX class) or on AVX512-BF16's vector products
(an AMD EPYC of the Zen 4 class); these tests run on whichever this machine has. On a CPU with
neither (AVX2 only) there is nothing to test, as the engine never chooses it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from trio_llm.engine.attention.interface import StepLayout
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.attention.torch_plans import queries_as_decodes
from trio_llm.engine.ops import paged_amx
from trio_llm.kernels import decode_attention_ref

pytestmark = pytest.mark.skipif(
    paged_amx.extension() is None, reason="the bf16 attention kernel needs AMX or AVX512-BF16"
)


def test_it_runs_on_the_instructions_this_cpu_has() -> None:
    """AMX's tiles where the CPU has them, else AVX512-BF16's vector products: the build
    follows the CPU (`-march=native`), and the engine's start-up names it."""
    from trio_llm.engine.ops.machine_record import cpu_flags

    ext = paged_amx.extension()
    assert ext is not None
    assert ext.isa() == ("amx" if "amx_bf16" in cpu_flags().split() else "avx512_bf16")


def paged(
    lens: list[int], heads: int, kv_heads: int, dim: int, block: int = 16, seed: int = 0
) -> tuple[torch.Tensor, ...]:
    """bf16 caches with each sequence's blocks scattered in a shuffled order, tables, lengths
    and one query per sequence."""
    gen = torch.Generator().manual_seed(seed)
    width = max(-(-n // block) for n in lens)
    num_blocks = len(lens) * width + 3
    tables = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width)
    shape = (num_blocks, block, kv_heads, dim)
    k_cache = torch.randn(shape, generator=gen).bfloat16()
    v_cache = torch.randn(shape, generator=gen).bfloat16()
    q = torch.randn(len(lens), heads, dim, generator=gen).bfloat16()
    return q, k_cache, v_cache, tables.contiguous(), torch.tensor(lens, dtype=torch.int64)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "dim", "block"),
    [(9, 3, 64, 16), (8, 8, 128, 16), (16, 2, 64, 32), (4, 1, 256, 16), (6, 2, 96, 8)],
)
def test_it_equals_the_reference_within_bf16_rounding(
    heads: int, kv_heads: int, dim: int, block: int
) -> None:
    lens = [1, 15, 16, 17, 63, 64, 65, 100, 300]
    q, k_cache, v_cache, tables, context = paged(lens, heads, kv_heads, dim, block)
    scale = dim**-0.5
    out = paged_amx.paged_attention(q, k_cache, v_cache, tables, context, scale)
    want = decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, context, scale)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)


def test_split_probabilities_are_closer_to_float32() -> None:
    """Two bf16 parts a probability (what batch invariance asks) against one: the mean error
    against the float32 reference drops to what rounding the output to bf16 leaves."""
    q, k_cache, v_cache, tables, context = paged([1, 15, 64, 65, 100, 300, 700], 9, 3, 64)
    want = decode_attention_ref(q.float(), k_cache.float(), v_cache.float(), tables, context, 0.1)
    errors = [
        (
            paged_amx.paged_attention(
                q, k_cache, v_cache, tables, context, 0.1, split=split
            ).float()
            - want
        )
        .abs()
        .mean()
        .item()
        for split in (False, True)
    ]
    assert errors[1] < 0.8 * errors[0], errors


def test_a_row_of_no_context_gets_zeros_and_no_nan_leaks_from_the_cache() -> None:
    """Positions past a context are never read as a value: the cache beyond it may hold NaN."""
    q, k_cache, v_cache, tables, _ = paged([40, 40], 4, 2, 64)
    k_cache[tables[0, 1], 10:] = float("nan")  # positions 26.. of sequence 0
    v_cache[tables[0, 1], 10:] = float("nan")
    out = paged_amx.paged_attention(q, k_cache, v_cache, tables, torch.tensor([20, 0]), 0.1)
    assert torch.isfinite(out[0].float()).all() and out[0].abs().sum() > 0
    assert torch.equal(out[1], torch.zeros_like(out[1]))


@pytest.mark.parametrize("split", [False, True])
def test_a_prefill_is_the_same_bits_in_any_chunking_and_as_decodes_alone(split: bool) -> None:
    """The prompt's queries laid out as decodes (as the engine lays them out under batch
    invariance): whole, in chunks of odd sizes, and each query alone."""
    n, heads, kv_heads, dim = 200, 9, 3, 64
    _, k_cache, v_cache, tables, _ = paged([n], heads, kv_heads, dim)
    q = torch.randn(n, heads, dim, generator=torch.Generator().manual_seed(5)).bfloat16()
    q_tables, q_lens = queries_as_decodes(
        tables.numpy(), torch.tensor([0, n]).numpy(), torch.tensor([n]).numpy()
    )
    q_tables, q_lens = torch.from_numpy(q_tables), torch.from_numpy(q_lens)
    whole = paged_amx.paged_attention(q, k_cache, v_cache, q_tables, q_lens, 0.125, split=split)
    cuts = [0, 1, 37, 64, 65, 130, 200]
    chunked = torch.cat(
        [
            paged_amx.paged_attention(
                q[a:b], k_cache, v_cache, q_tables[a:b], q_lens[a:b], 0.125, split=split
            )
            for a, b in itertools.pairwise(cuts)
        ]
    )
    assert torch.equal(chunked, whole)
    for i in (0, 15, 16, 63, 64, 127, 199):
        alone = paged_amx.paged_attention(
            q[i : i + 1],
            k_cache,
            v_cache,
            q_tables[i : i + 1],
            q_lens[i : i + 1],
            0.125,
            split=split,
        )
        assert torch.equal(alone, whole[i : i + 1]), i
    # The causal reference: query i over positions 0..i.
    want = decode_attention_ref(
        q.float(), k_cache.float(), v_cache.float(), q_tables, q_lens, 0.125
    )
    torch.testing.assert_close(whole.float(), want, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("split", [False, True])
def test_a_row_is_the_same_alone_in_any_batch_and_on_any_threads(split: bool) -> None:
    lens = [
        int(n) for n in torch.randint(1, 400, (32,), generator=torch.Generator().manual_seed(1))
    ]
    q, k_cache, v_cache, tables, context = paged(lens, 9, 3, 64)
    batched = paged_amx.paged_attention(q, k_cache, v_cache, tables, context, 0.125, split=split)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_thread = paged_amx.paged_attention(
            q, k_cache, v_cache, tables, context, 0.125, split=split
        )
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one_thread, batched)
    for b in (0, 7, 31):
        alone = paged_amx.paged_attention(
            q[b : b + 1],
            k_cache,
            v_cache,
            tables[b : b + 1],
            context[b : b + 1],
            0.125,
            split=split,
        )
        assert torch.equal(alone, batched[b : b + 1]), b


@pytest.mark.parametrize("num_decodes", [1, 3])
@pytest.mark.parametrize("bucket", [0, 64])
def test_a_mixed_step_equals_the_reference_on_the_backend(num_decodes: int, bucket: int) -> None:
    """The torch backend's step on a bf16 cache, plain layers: decodes beside a prompt chunk
    that follows earlier positions of its sequence. Every query on the tiles, with one bf16
    part a probability or invariance's two, gets its causal attention."""
    heads, kv_heads, dim, block = 9, 3, 64, 16
    decode_lens = [37, 130, 250][:num_decodes]
    prompt_start, prompt_rows = 100, 70  # the chunk's queries are positions 100..169
    lens = [*decode_lens, prompt_start + prompt_rows]
    _, k_cache, v_cache, tables, _ = paged(lens, heads, kv_heads, dim, block)
    gen = torch.Generator().manual_seed(3)
    rows = num_decodes + prompt_rows
    q = torch.randn(rows, heads, dim, generator=gen).bfloat16()
    k_new = torch.randn(rows, kv_heads, dim, generator=gen).bfloat16()
    v_new = torch.randn(rows, kv_heads, dim, generator=gen).bfloat16()
    positions = [n - 1 for n in decode_lens] + list(range(prompt_start, prompt_start + prompt_rows))
    owners = list(range(num_decodes)) + [num_decodes] * prompt_rows
    slots = np.array(
        [int(tables[b, p // block]) * block + p % block for b, p in zip(owners, positions)]
    )
    layout = StepLayout(
        num_decodes=num_decodes,
        block_tables=tables.numpy(),
        cu_seqlens_q=np.array([*range(num_decodes + 1), rows]),
        context_lens=np.array(lens),
        slot_mapping=slots,
        key_bucket=bucket,
        plain_attention=True,
    )
    meta = TorchAttentionMetadata.build(layout, k_cache)
    out = meta.forward(q, k_new, v_new, k_cache, v_cache, 0.125)
    # The reference: each query as a decode over its own context, from the cache just written.
    q_tables, q_lens = queries_as_decodes(tables.numpy(), layout.cu_seqlens_q, layout.context_lens)
    want = decode_attention_ref(
        q.float(),
        k_cache.float(),
        v_cache.float(),
        torch.from_numpy(q_tables),
        torch.from_numpy(q_lens),
        0.125,
    )
    torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=2e-2)
    assert meta.decode is not None and meta.decode.in_place is not None
    # Two parts a probability only where invariance runs the AMX class's int8-activation
    # kernel; on AVX512-BF16 one part measured the same perplexity at two-thirds the cost.
    split = bool(bucket) and paged_amx.extension().isa() == "amx"
    assert meta.decode.in_place.amx and meta.decode.in_place.split == split
