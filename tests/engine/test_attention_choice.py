"""Which attention kernel the torch backend plans a CPU step on, with the machine faked (the
AMX kernel's presence is a property of the CPU class): every query on AMX tiles where they run
and the model's layers attend plainly, and SDPA with the float kernel elsewhere. Only the plans
are checked, so this runs on every class; tests/engine/test_paged_amx.py runs the kernel where
it exists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trio_llm.engine.attention.interface import StepLayout
from trio_llm.engine.attention.torch_backend import TorchAttentionMetadata
from trio_llm.engine.ops import paged_amx, paged_decode

BLOCK = 16


def layout(
    num_decodes: int, prompt_rows: int, *, bucket: int = 0, plain: bool = True
) -> StepLayout:
    """Decodes at 40 positions each, then one prompt chunk of `prompt_rows` new tokens."""
    seqs = num_decodes + (1 if prompt_rows else 0)
    tables = np.arange(seqs * 8, dtype=np.int64).reshape(seqs, 8)
    lens = np.array([40] * num_decodes + ([prompt_rows] if prompt_rows else []), dtype=np.int64)
    cu = np.array([*range(num_decodes + 1)] + ([num_decodes + prompt_rows] if prompt_rows else []))
    rows = int(cu[-1])
    return StepLayout(
        num_decodes=num_decodes,
        block_tables=tables,
        cu_seqlens_q=cu.astype(np.int64),
        context_lens=lens,
        slot_mapping=np.arange(rows, dtype=np.int64),
        key_bucket=bucket,
        plain_attention=plain,
    )


@pytest.fixture
def cache() -> torch.Tensor:
    return torch.zeros(64, BLOCK, 3, 64, dtype=torch.bfloat16)


@pytest.fixture
def amx_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paged_amx, "serves", lambda cache: True)
    monkeypatch.setattr(paged_decode, "supports", lambda cache: True)


@pytest.fixture
def no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(paged_amx, "serves", lambda cache: False)
    monkeypatch.setattr(paged_decode, "supports", lambda cache: True)


@pytest.mark.usefixtures("amx_here")
@pytest.mark.parametrize("decodes", [1, 4])
def test_with_amx_every_query_is_a_decode_on_the_tiles(cache: torch.Tensor, decodes: int) -> None:
    meta = TorchAttentionMetadata.build(layout(decodes, 30), cache)
    assert meta.num_decodes == decodes + 30 and meta.decode is not None
    assert meta.decode.in_place is not None and meta.decode.in_place.amx
    assert not meta.decode.in_place.split and not meta.prefills
    # The prompt's queries at positions 0..29: context lengths 1..30, after the decodes' 40.
    assert meta.decode.in_place.context_lens.tolist() == [40] * decodes + list(range(1, 31))


@pytest.mark.usefixtures("amx_here")
@pytest.mark.parametrize("isa", ["amx", "avx512_bf16"])
def test_invariance_puts_every_query_on_the_kernel_with_split_probabilities_on_amx_only(
    cache: torch.Tensor, isa: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two bf16 parts a probability where invariance runs the AMX class's int8-activation
    kernel; one on AVX512-BF16, where it measured the same perplexity (the machine faked)."""

    class Built:
        @staticmethod
        def isa() -> str:
            return isa

    monkeypatch.setattr(paged_amx, "extension", lambda: Built)
    for decodes in (1, 4):
        meta = TorchAttentionMetadata.build(layout(decodes, 30, bucket=64), cache)
        assert meta.decode is not None and meta.decode.in_place is not None
        assert meta.decode.in_place.amx
        assert meta.decode.in_place.split == (isa == "amx")
        assert meta.num_decodes == decodes + 30


@pytest.mark.usefixtures("amx_here")
def test_layers_with_windows_or_soft_caps_keep_sdpa_without_invariance(
    cache: torch.Tensor,
) -> None:
    meta = TorchAttentionMetadata.build(layout(4, 30, plain=False), cache)
    assert meta.num_decodes == 4 and meta.prefills
    assert meta.decode is not None and meta.decode.in_place is not None
    assert not meta.decode.in_place.amx


@pytest.mark.usefixtures("no_amx")
def test_without_amx_prompts_take_sdpa_and_decodes_the_float_kernel(cache: torch.Tensor) -> None:
    meta = TorchAttentionMetadata.build(layout(4, 30), cache)
    assert meta.num_decodes == 4 and meta.prefills
    assert meta.decode is not None and meta.decode.in_place is not None
    assert not meta.decode.in_place.amx
    invariant = TorchAttentionMetadata.build(layout(4, 30, bucket=64), cache)
    assert invariant.decode is not None and invariant.decode.in_place is not None
    assert not invariant.decode.in_place.amx and invariant.num_decodes == 34
