"""N-gram prompt-lookup drafts (engine/step/speculative.py): what is proposed, when, and that a
stream decoded with drafts equals the same stream decoded one token at a time."""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_helpers import make_core, request, run

from trio_llm.engine.step import speculative


def test_the_longest_recurring_suffix_proposes_what_followed_it_last() -> None:
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    # [1, 2, 3] occurred twice before; the latest occurrence was followed by 7, 8, 5, 1.
    assert speculative.propose(tokens, 4) == [7, 8, 5, 1]
    assert speculative.propose(tokens, 2) == [7, 8]


def test_no_recurrence_no_drafts() -> None:
    assert speculative.propose(list(range(50)), 4) == []
    assert speculative.propose([4, 4], 4) == []
    # A single repeated token is too weak a hint (MIN_NGRAM is 2).
    assert speculative.propose([1, 2, 3, 4, 3], 4) == []


def test_a_match_at_the_end_proposes_only_what_exists() -> None:
    assert speculative.propose([5, 6, 5, 6], 4) == [5, 6]


def test_auto_is_off_where_drafting_was_measured_slower() -> None:
    assert speculative.resolve_mode("auto", quantized=False) == "off"
    assert speculative.resolve_mode("auto", quantized=True) == "off"
    assert speculative.resolve_mode("on", quantized=False) == "on"
    with pytest.raises(ValueError, match="ngram_speculation"):
        speculative.resolve_mode("sometimes", quantized=True)


@pytest.mark.parametrize("sampling", [{}, {"seed": 3, "temperature": 1.0}], ids=["greedy", "seed"])
def test_a_stream_with_drafts_equals_the_stream_without(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, sampling: dict[str, object]
) -> None:
    """Drafts that are right save steps, drafts that are wrong cost rows: with batch
    invariance neither changes a token, greedy or seeded (a seeded draw is keyed by its output
    position, whichever row samples it). (A random tiny model rarely repeats itself, so the
    proposer is replaced by one that knows the answer and lies on every other step.)"""
    prompt = [101, 102, 103, 104, 105] * 8
    params = {"max_tokens": 24, "ignore_eos": True, **sampling}
    cores = {
        # Batch invariance: a draft row then computes bitwise what a one-token step does.
        mode: make_core(
            tiny_model_dir,
            quantization="int8",
            dtype="auto",
            ngram_speculation=mode,
            batch_invariant="on",
            device="cpu",  # where batch invariance and the quantized kernels are
        )
        for mode in ("off", "on")
    }
    plain = run(cores["off"], [request("a", prompt, **params)])["a"]
    calls: list[int] = []

    def oracle(tokens: list[int], num_drafts: int = speculative.NUM_DRAFTS) -> list[int]:
        calls.append(len(tokens))
        done = len(tokens) - len(prompt)
        right = plain.token_ids[done : done + num_drafts]
        return right if len(calls) % 2 else [7] * len(right)

    monkeypatch.setattr(speculative, "propose", oracle)
    steps = 0
    core = cores["on"]
    core.add_request(request("a", prompt, **params))
    drafted: list[int] = []
    while core.has_work():
        steps += 1
        for out in core.step().outputs:
            drafted += out.new_token_ids
    assert drafted == plain.token_ids
    assert calls, "no drafts were proposed"
    # One prefill step, then 23 tokens: right drafts commit 5 tokens a step, wrong ones 1.
    assert steps < 1 + 23 / 2


def test_penalized_requests_get_no_drafts(tiny_model_dir: Path) -> None:
    core = make_core(
        tiny_model_dir, quantization="int8", dtype="auto", ngram_speculation="on", device="cpu"
    )
    prompt = [101, 102, 103] * 8
    for extra in ({"repetition_penalty": 1.2}, {"presence_penalty": 0.5}):
        core.add_request(request("r", prompt, max_tokens=8, **extra))
        while core.has_work():
            core.step()
            assert all(not s.draft_token_ids for s in core.scheduler.running)
