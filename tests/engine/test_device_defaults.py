"""What unset engine arguments mean on each kind of device, with the GPU faked."""

from __future__ import annotations

import pytest
import torch

from trio_llm.config import CPU_KV_CACHE_BYTES, DEVICE_DEFAULTS, EngineArgs
from trio_llm.engine.models import loader

GIB = 1 << 30


def test_a_cpu_keeps_its_fixed_defaults() -> None:
    args = EngineArgs()
    assert args.step_token_budget("cpu") == 2048
    assert args.kv_cache_bytes("cpu") == CPU_KV_CACHE_BYTES == GIB
    assert loader.free_device_memory("cpu") is None


def test_a_gpu_takes_a_share_of_its_free_memory_and_a_larger_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[torch.device] = []

    def mem_get_info(device: torch.device) -> tuple[int, int]:
        seen.append(device)
        return 100 * GIB, 141 * GIB

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    free = loader.free_device_memory("cuda:1")
    assert free == 100 * GIB and seen == [torch.device("cuda:1")]
    args = EngineArgs()
    assert args.kv_cache_bytes("cuda:1", free) == int(0.8 * 100 * GIB)
    assert EngineArgs(kv_cache_fraction=0.5).kv_cache_bytes("cuda", free) == 50 * GIB
    assert args.step_token_budget("cuda") == DEVICE_DEFAULTS["cuda"].max_num_batched_tokens
    assert args.step_token_budget("cuda") >= 4 * args.step_token_budget("cpu")


def test_what_is_asked_for_wins_on_every_device() -> None:
    args = EngineArgs(kv_cache_memory="2GiB", max_num_batched_tokens=64)
    for device, free in (("cpu", None), ("cuda", 100 * GIB)):
        assert args.kv_cache_bytes(device, free) == 2 * GIB
        assert args.step_token_budget(device) == 64


def test_auto_is_checkable_before_any_device_is_known() -> None:
    """The server checks --kv-cache-memory before it starts an engine."""
    assert EngineArgs().kv_cache_bytes() == GIB
    assert EngineArgs().kv_cache_bytes("cuda") == GIB


def test_a_fraction_outside_0_1_is_refused() -> None:
    with pytest.raises(ValueError, match="kv_cache_fraction"):
        EngineArgs(kv_cache_fraction=1.5).kv_cache_bytes("cuda", GIB)
