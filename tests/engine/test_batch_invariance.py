"""Batch invariance: a request gets the same tokens alone, in any company, and however its prompt
is chunked (engine/row_tiles.py, the torch backend's key buckets)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from engine_helpers import make_core, random_prompts, request, run

from trio_llm.engine import row_tiles
from trio_llm.ipc.messages import EngineCoreRequest

LENGTHS = [5, 17, 33, 64, 90, 120, 9, 45] * 4


def requests() -> list[EngineCoreRequest]:
    """16 greedy and 16 seeded-sampling requests of mixed prompt lengths."""
    out = []
    for i, prompt in enumerate(random_prompts(LENGTHS, seed=21)):
        params = {"temperature": 0.8, "top_p": 0.95, "seed": 100 + i} if i % 2 else {}
        out.append(request(str(i), prompt, max_tokens=12, ignore_eos=True, **params))
    return out


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_32_requests_alone_and_together_get_the_same_tokens(
    tiny_model_dir: Path, dtype: str
) -> None:
    # A small step budget chunks the prompts differently together than alone.
    core = make_core(tiny_model_dir, dtype=dtype, batch_invariant="on", max_num_batched_tokens=64)
    assert core.runner.row_tile > 0
    reqs = requests()
    alone = {}
    for r in reqs:
        alone.update({k: v.token_ids for k, v in run(core, [r]).items()})
    together = {k: v.token_ids for k, v in run(core, reqs).items()}
    assert together == alone
    # and with the whole prompts in one step each, in another engine
    roomy = make_core(tiny_model_dir, dtype=dtype, batch_invariant="on")
    assert {k: v.token_ids for k, v in run(roomy, reqs).items()} == alone


def test_off_is_off_and_auto_follows_the_probe(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert make_core(tiny_model_dir, batch_invariant="off").runner.row_tile == 0
    monkeypatch.setattr(row_tiles, "probe", lambda shapes, dtype, device: 0)
    assert make_core(tiny_model_dir, batch_invariant="auto").runner.row_tile == 0
    assert make_core(tiny_model_dir, batch_invariant="on").runner.row_tile == row_tiles.PADDED_TILE
    monkeypatch.setattr(row_tiles, "probe", lambda shapes, dtype, device: 32)
    assert make_core(tiny_model_dir, batch_invariant="auto").runner.row_tile == 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_and_padded_matmuls_equal_plain_ones_in_value(dtype: torch.dtype) -> None:
    x, w = torch.randn(77, 48).to(dtype), torch.randn(40, 48).to(dtype)
    b = torch.randn(40).to(dtype)
    plain = torch.nn.functional.linear(x, w, b).float()
    for linear in (row_tiles.tiled(16), row_tiles.padded(8)):
        torch.testing.assert_close(linear(x, w, b).float(), plain, rtol=2e-2, atol=2e-2)
