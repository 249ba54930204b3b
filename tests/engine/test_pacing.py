"""Prefill pacing (engine/step/pacing.py): beside a decoding stream a long prompt advances a
capped chunk per step, the cap follows the measured cost of a prompt token, and a prompt with
no stream beside it keeps the whole step budget."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import make_core, random_prompts, request

from trio_llm.engine.step.pacing import FIRST_CHUNK, MIN_CHUNK, PrefillPace


def test_the_cap_follows_the_measured_cost() -> None:
    pace = PrefillPace(512, target=0.05)
    assert pace.cap() == FIRST_CHUNK
    pace.record(0.040, decodes=1, prefill_tokens=0)  # a decode step: 40 ms
    pace.record(0.050, decodes=1, prefill_tokens=100)  # 10 ms more for 100 tokens
    assert 495 <= pace.cap() <= 500  # 0.1 ms a token: 50 ms hold 500
    pace.record(1.040, decodes=1, prefill_tokens=100)  # now 10 ms a token
    assert MIN_CHUNK <= pace.cap() < 50
    pace.record(0.040, decodes=1, prefill_tokens=MIN_CHUNK - 1)  # too few to tell: ignored
    slow = PrefillPace(512, target=0.05)
    slow.record(0.5, decodes=1, prefill_tokens=0)
    slow.record(0.6, decodes=1, prefill_tokens=100)
    assert 495 <= slow.cap() <= 500  # a slow decode step earns as much prefill time as it takes


def test_pacing_is_off_unless_asked_for(tiny_model_dir: Path) -> None:
    """Off by default: served in turn, a 50 ms pace cost a closed loop of 32 streams a quarter
    of its tokens (docs/notes/2026-12-04-wave4.md)."""
    assert make_core(tiny_model_dir).pace is None
    assert make_core(tiny_model_dir, prefill_pace_ms=50).pace is not None


def test_a_long_prompt_beside_a_stream_advances_by_the_cap(tiny_model_dir: Path) -> None:
    core = make_core(tiny_model_dir, prefill_pace_ms=50)
    [stream, prompt] = random_prompts([4, 400], seed=3)
    core.add_request(request("stream", stream, max_tokens=64, ignore_eos=True))
    core.step()
    core.step()
    core.add_request(request("long", prompt, max_tokens=2, ignore_eos=True))
    cap = core.pace.cap()  # type: ignore[union-attr]
    core.step()
    assert 0 < core.requests["long"].num_computed_tokens <= cap < 400

    alone = make_core(tiny_model_dir, prefill_pace_ms=50)
    alone.add_request(request("long", prompt, max_tokens=2, ignore_eos=True))
    alone.step()
    assert alone.requests["long"].num_computed_tokens == 400  # the whole budget, alone
