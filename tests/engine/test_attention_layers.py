"""The torch attention backend on what a model's layers ask of it beyond plain causal attention:
sliding windows, soft-capped scores, and layers whose caches differ in shape, on mixed steps
(decodes, whole prompts, later chunks after cached context), with and without the key buckets
of batch invariance; each against the kernels' fp32 reference given the same window and cap.
And the Triton kernels, which have neither, never get a layer that needs one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from trio_llm.engine.attention import StepLayout
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.models.attention_layers import AttentionLayer, attention_backend
from trio_llm.kernels import prefill_attention_ref
from trio_llm.model_files import UnsupportedModelError

BLOCK = 8


def _step(decodes: list[int], chunks: list[tuple[int, int]], seed: int) -> StepLayout:
    """A step of `decodes` (context lengths) then prefill `chunks` ((earlier, new) tokens),
    each sequence on its own shuffled blocks."""
    rng = np.random.default_rng(seed)
    spans = [(ctx - 1, 1) for ctx in decodes] + chunks
    contexts = np.array([earlier + new for earlier, new in spans], dtype=np.int64)
    widest = int(-(-contexts.max() // BLOCK))
    blocks = rng.permutation(len(spans) * widest).reshape(len(spans), widest) + 1
    cu = np.concatenate([[0], np.cumsum([new for _, new in spans])]).astype(np.int64)
    positions = np.concatenate([np.arange(e, e + n) for e, n in spans]).astype(np.int64)
    row_seq = np.repeat(np.arange(len(spans)), [new for _, new in spans])
    slots = blocks[row_seq, positions // BLOCK] * BLOCK + positions % BLOCK
    return StepLayout(
        num_decodes=len(decodes),
        block_tables=blocks.astype(np.int64),
        cu_seqlens_q=cu,
        context_lens=contexts,
        slot_mapping=slots.astype(np.int64),
    )


def _caches(layout: StepLayout, heads: int, dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    num_blocks = int(layout.block_tables.max()) + 1
    k = torch.randn(num_blocks, BLOCK, heads, dim, generator=g)
    return k, torch.randn(num_blocks, BLOCK, heads, dim, generator=g)


STEP = ([5, 40, 17], [(0, 23), (30, 9), (0, 1)])
"""Three decodes (one inside any window, two past it), a whole prompt, a chunk after 30
cached tokens, and a one-token prompt."""


@pytest.mark.parametrize("key_bucket", [0, 64], ids=["plain", "key-buckets"])
@pytest.mark.parametrize(
    ("window", "softcap"),
    [(0, None), (8, None), (13, None), (0, 5.0), (8, 5.0), (100, None)],
    ids=["causal", "window-8", "window-13", "softcap", "window-softcap", "window-past-all"],
)
def test_a_layer_gets_the_attention_its_window_and_cap_define(
    window: int, softcap: float | None, key_bucket: int
) -> None:
    layout = dataclasses.replace(_step(*STEP, seed=0), key_bucket=key_bucket)
    g = torch.Generator().manual_seed(1)
    tokens, hq = int(layout.cu_seqlens_q[-1]), 4
    # Two layer shapes in one step: the first builds the plans, the second gets its own.
    for hkv, dim in [(2, 16), (1, 32)]:
        k_cache, v_cache = _caches(layout, hkv, dim, seed=dim)
        q = torch.randn(tokens, hq, dim, generator=g)
        k = torch.randn(tokens, hkv, dim, generator=g)
        v = torch.randn(tokens, hkv, dim, generator=g)
        meta = TorchAttentionMetadata.build(layout, _caches(layout, 2, 16, seed=0)[0])
        got = meta.forward(q, k, v, k_cache, v_cache, 0.3, window=window or None, softcap=softcap)
        expected = prefill_attention_ref(
            q,
            k_cache,
            v_cache,
            torch.from_numpy(layout.block_tables),
            torch.from_numpy(layout.cu_seqlens_q),
            torch.from_numpy(layout.context_lens),
            0.3,
            window=window,
            softcap=softcap,
        )
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_window_past_every_context_reuses_the_steps_plans() -> None:
    layout = _step(*STEP, seed=0)
    k_cache, _ = _caches(layout, 2, 16, seed=0)
    meta = TorchAttentionMetadata.build(layout, k_cache)
    assert meta.variant(int(layout.context_lens.max()), k_cache) is meta
    assert meta.variant(None, k_cache) is meta
    windowed = meta.variant(8, k_cache)
    assert windowed is not meta and meta.variant(8, k_cache) is windowed


def _layers(window: int | None = None, softcap: float | None = None) -> list[AttentionLayer]:
    return [AttentionLayer(torch.nn.Module(), 2, 16, window, softcap)]


@pytest.mark.parametrize(
    ("layers", "requested", "backend"),
    [
        (_layers(), "auto", "triton"),
        (_layers(window=4096), "auto", "triton"),  # no context outgrows it
        (_layers(window=512), "auto", "torch"),
        (_layers(softcap=50.0), "auto", "torch"),
    ],
    ids=["plain", "window-past-every-context", "window", "softcap"],
)
def test_the_triton_kernels_get_only_the_layers_they_compute(
    layers: list[AttentionLayer], requested: str, backend: str
) -> None:
    chosen, why = attention_backend(layers, "triton", requested, max_model_len=4096)
    assert chosen == backend
    assert (why is None) == (backend == "triton")


def test_asking_for_triton_for_a_model_it_cannot_compute_is_refused_with_the_reason() -> None:
    with pytest.raises(UnsupportedModelError, match="no attention soft-capping"):
        attention_backend(_layers(softcap=50.0), "triton", "triton", max_model_len=4096)
    with pytest.raises(UnsupportedModelError, match=r"no sliding windows \(a window of 512"):
        attention_backend(_layers(window=512), "triton", "triton", max_model_len=4096)
