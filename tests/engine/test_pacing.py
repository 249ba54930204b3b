"""Prefill pacing (engine/step/pacing.py): beside a decoding stream a long prompt advances a
capped chunk per step (one request's chunk by default, all prompts together when asked), the
caps follow the measured cost of a prompt token, and a prompt with no stream beside it keeps
the whole step budget."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import make_core, random_prompts, request

from trio_llm.engine.step.pacing import (
    FIRST_CHUNK,
    FIRST_LONG_CHUNK,
    MIN_CHUNK,
    MIN_LONG_CHUNK,
    PrefillPace,
)


def test_the_cap_follows_the_measured_cost() -> None:
    pace = PrefillPace(512, target=0.05)
    assert pace.cap() == FIRST_CHUNK and pace.chunk_cap() is None  # no cap on one prompt
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


def test_one_prompts_chunk_follows_the_measured_cost() -> None:
    pace = PrefillPace(2048, target=None, long_target=0.05)
    assert pace.cap() is None  # no cap on all prompts together
    assert pace.chunk_cap() == FIRST_LONG_CHUNK  # nothing measured yet
    pace.record(0.100, decodes=0, prefill_tokens=400)  # a prompt alone: 0.25 ms a token
    assert pace.chunk_cap() == 200  # 50 ms hold 200 tokens
    pace.record(0.010, decodes=2, prefill_tokens=0)  # a decode step: 10 ms
    pace.record(0.010 + 2.0, decodes=2, prefill_tokens=200)  # now 10 ms a token beside it
    assert pace.chunk_cap() == MIN_LONG_CHUNK  # however slow, a prompt advances
    pace.record(0.050, decodes=2, prefill_tokens=3)  # too few to tell: ignored
    fast = PrefillPace(2048, target=None, long_target=0.05)
    fast.record(0.001, decodes=0, prefill_tokens=1000)
    assert fast.chunk_cap() == 2048  # never more than the step budget


def test_one_requests_cap_is_on_and_all_prompts_cap_off_by_default(tiny_model_dir: Path) -> None:
    """The cap on all prompts of a step is off unless asked for: served in turn, a 50 ms pace
    cost a closed loop of 32 streams a quarter of its tokens (docs/notes/2026-12-04-wave4.md).
    The cap on one request's chunk is on: it leaves such a loop's short prompts whole."""
    pace = make_core(tiny_model_dir).pace
    assert pace is not None and pace.target is None and pace.long_target == 0.05
    assert make_core(tiny_model_dir, long_prefill_ms=0).pace is None
    both = make_core(tiny_model_dir, prefill_pace_ms=50).pace
    assert both is not None and both.target == 0.05 and both.long_target == 0.05


def test_a_long_prompt_beside_a_stream_advances_by_one_requests_cap(
    tiny_model_dir: Path,
) -> None:
    """The stall of issue 40: one long prompt beside a stream takes chunks of the cap, while
    short prompts (under the cap) that arrive together beside the same stream are computed whole."""
    core = make_core(tiny_model_dir, long_prefill_ms=0.001)  # the cap sits at its least
    [stream, long, *short] = random_prompts([40, 400, 12, 12, 12], seed=4)
    core.add_request(request("stream", stream, max_tokens=64, ignore_eos=True))
    core.step()  # its 40-token prompt measures a token's cost
    core.step()
    core.add_request(request("long", long, max_tokens=2, ignore_eos=True))
    for i, prompt in enumerate(short):
        core.add_request(request(f"short{i}", prompt, max_tokens=2, ignore_eos=True))
    core.step()
    assert core.requests["long"].num_computed_tokens == MIN_LONG_CHUNK
    assert all(core.requests[f"short{i}"].num_computed_tokens == 12 for i in range(3))
    core.step()
    assert core.requests["long"].num_computed_tokens == 2 * MIN_LONG_CHUNK

    alone = make_core(tiny_model_dir, long_prefill_ms=0.001)
    alone.add_request(request("long", long, max_tokens=2, ignore_eos=True))
    alone.step()
    assert alone.requests["long"].num_computed_tokens == 400  # the whole budget, alone


def test_a_more_urgent_prompt_is_not_capped(tiny_model_dir: Path) -> None:
    """Under priority scheduling a prompt more urgent than every stream may preempt them all,
    so it may also hold them for one longer step: its first token comes as soon as alone."""
    core = make_core(tiny_model_dir, long_prefill_ms=0.001, scheduling_policy="priority")
    [stream, long] = random_prompts([40, 400], seed=5)
    core.add_request(request("stream", stream, priority=1, max_tokens=64, ignore_eos=True))
    core.step()
    core.step()
    core.add_request(request("urgent", long, priority=0, max_tokens=2, ignore_eos=True))
    core.add_request(request("peer", long[::-1], priority=1, max_tokens=2, ignore_eos=True))
    core.step()
    assert core.requests["urgent"].num_computed_tokens == 400
    assert core.requests["peer"].num_computed_tokens <= MIN_LONG_CHUNK


def test_a_long_prompt_beside_a_stream_advances_by_the_cap(tiny_model_dir: Path) -> None:
    core = make_core(tiny_model_dir, prefill_pace_ms=50, long_prefill_ms=0)
    [stream, prompt] = random_prompts([4, 400], seed=3)
    core.add_request(request("stream", stream, max_tokens=64, ignore_eos=True))
    core.step()
    core.step()
    core.add_request(request("long", prompt, max_tokens=2, ignore_eos=True))
    cap = core.pace.cap()  # type: ignore[union-attr]
    core.step()
    assert 0 < core.requests["long"].num_computed_tokens <= cap < 400

    alone = make_core(tiny_model_dir, prefill_pace_ms=50, long_prefill_ms=0)
    alone.add_request(request("long", prompt, max_tokens=2, ignore_eos=True))
    alone.step()
    assert alone.requests["long"].num_computed_tokens == 400  # the whole budget, alone


def test_prompts_that_arrived_together_are_not_cut_for_each_other(tiny_model_dir: Path) -> None:
    """A stream that began after a prompt arrived has no claim to be protected from it (a
    closed loop's long prompts all arrive at once: cutting them cost such a loop 8-15% of its
    tok/s); a prompt that arrives after the stream began is cut."""
    core = make_core(tiny_model_dir, long_prefill_ms=0.001, max_num_batched_tokens=256)
    [first, second, later] = random_prompts([40, 400, 400], seed=6)
    core.add_request(request("first", first, max_tokens=64, ignore_eos=True))
    core.add_request(request("second", second, max_tokens=2, ignore_eos=True))
    core.step()  # no stream yet: the budget, 40 + 216
    assert core.requests["second"].num_computed_tokens == 216
    core.step()  # "first" decodes now; "second" was there before it began: not cut
    assert core.requests["second"].num_computed_tokens == 400
    core.add_request(request("later", later, max_tokens=2, ignore_eos=True))
    core.step()  # "later" arrived while "first" was decoding: cut
    assert core.requests["later"].num_computed_tokens == MIN_LONG_CHUNK
