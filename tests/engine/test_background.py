"""Background work (a batch's lines) yields to interactive requests under the default fcfs
policy: it waits behind them, never shares the step that ends in an interactive first token,
takes at most `BACKGROUND_ROWS` decode rows and no prefill beside interactive decodes, gives up
its seat and its blocks first, and is never starved. First on plain sequences (no model), then
on the tiny model's EngineCore."""

from __future__ import annotations

from pathlib import Path

import msgspec
from engine_helpers import Finished, make_core, random_prompts, request, run

from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.core import EngineCore
from trio_llm.engine.step.scheduler import (
    BACKGROUND_CHUNK,
    BACKGROUND_PATIENCE,
    BACKGROUND_ROWS,
    Scheduler,
)
from trio_llm.engine.step.sequence import ScheduledBatch, Sequence
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.sampling_params import SamplingParams

BS = 4


def seq(n: int, rid: str, arrival: int, *, background: bool, max_tokens: int = 100) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=[1] * n,
        params=SamplingParams(temperature=0.0),
        max_tokens=max_tokens,
        arrival=arrival,
        background=background,
    )


def scheduler(num_blocks: int = 256, budget: int = 256, max_seqs: int = 8) -> Scheduler:
    """An fcfs scheduler: the server's default."""
    return Scheduler(
        BlockManager(num_blocks, BS, enable_prefix_caching=False),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=frozenset({0}),
        max_model_len=1000,
    )


def step(sched: Scheduler) -> dict[str, int]:
    """One step; each scheduled sequence's tokens."""
    batch = sched.schedule()
    assert sum(batch.num_tokens) <= sched.max_num_batched_tokens
    assert len(sched.running) <= sched.max_num_seqs
    sched.update(
        batch,
        [
            7 if s.num_computed_tokens + n == s.num_tokens else None
            for s, n in zip(batch.seqs, batch.num_tokens)
        ],
    )
    return {s.request_id: n for s, n in zip(batch.seqs, batch.num_tokens)}


def background_lines(sched: Scheduler, count: int, prompt: int = 10) -> None:
    for i in range(count):
        sched.add(seq(prompt, f"b{i}", i, background=True))


def test_an_interactive_request_goes_before_earlier_background_lines() -> None:
    sched = scheduler()
    background_lines(sched, 2)
    sched.add(seq(10, "i", 2, background=False, max_tokens=3))
    assert step(sched) == {"i": 10}  # its prefill step carries nothing of the batch
    assert step(sched) == {"i": 1}  # beside its decode: no background prefill
    assert step(sched) == {"i": 1}
    assert step(sched) == {"b0": 10, "b1": 10}  # then the batch, in short chunks
    assert BACKGROUND_CHUNK >= 10 + 10  # (both lines fit one chunk)


def test_alone_the_batch_prefills_in_short_chunks_and_decodes_every_row() -> None:
    sched = scheduler()
    background_lines(sched, 4, prompt=20)
    while any(s.num_uncomputed_tokens > 1 for s in sched.running) or sched.waiting:
        got = step(sched)
        assert sum(n for n in got.values() if n > 1) <= BACKGROUND_CHUNK
    assert step(sched) == {f"b{i}": 1 for i in range(4)}  # decodes are not capped alone


def test_an_interactive_arrival_gets_the_next_step_alone_then_decodes_beside_few_rows() -> None:
    sched = scheduler()
    background_lines(sched, 4)
    while any(s.num_uncomputed_tokens > 1 for s in sched.running) or sched.waiting:
        step(sched)
    assert step(sched) == {f"b{i}": 1 for i in range(4)}
    sched.add(seq(30, "i", 9, background=False, max_tokens=20))
    assert step(sched) == {"i": 30}
    sched.add(seq(10, "late", 10, background=True))  # a new line waits: no prefill beside
    for _ in range(19):
        got = step(sched)
        assert got["i"] == 1
        assert len(got) - 1 <= BACKGROUND_ROWS and "late" not in got
    assert "i" not in {s.request_id for s in sched.running}  # finished (length)
    assert step(sched)["late"] == 10


def test_an_interactive_request_takes_a_background_seat_with_fcfs() -> None:
    sched = scheduler(max_seqs=2)
    background_lines(sched, 2)
    step(sched)
    sched.add(seq(6, "i", 5, background=False))
    assert step(sched) == {"i": 6}
    assert [s.request_id for s in sched.waiting] == ["b1"]  # the later line gave way
    assert sched.num_preemptions == 1


def test_background_sequences_are_preempted_first_when_blocks_run_short() -> None:
    # Blocks for two 7-token prompts (two blocks each), none more: the interactive request's
    # first decode that needs a new block preempts the line, which arrived first (by arrival
    # alone the interactive request would have given way).
    sched = scheduler(num_blocks=4)
    sched.add(seq(7, "b", 0, background=True))
    assert step(sched) == {"b": 7}
    sched.add(seq(7, "i", 1, background=False))
    assert step(sched) == {"i": 7}  # the line has no row in that step
    assert step(sched) == {"i": 1, "b": 1}  # position 7: both in their second block
    assert step(sched) == {"i": 1}  # position 8: a new block, the line's
    assert [s.request_id for s in sched.waiting] == ["b"]
    assert sched.num_preemptions == 1


def test_a_steady_interactive_load_never_starves_the_batch() -> None:
    sched = scheduler()
    sched.add(seq(10, "i", 0, background=False, max_tokens=900))
    step(sched)
    sched.add(seq(40, "b", 1, background=True, max_tokens=3))
    steps_with_a_chunk = []
    for k in range(4 * BACKGROUND_PATIENCE):
        got = step(sched)
        assert got["i"] == 1  # the interactive stream gets its token every step
        if got.get("b", 0) > 1:
            assert got["b"] <= BACKGROUND_CHUNK
            steps_with_a_chunk.append(k)
        if "b" not in {s.request_id for s in sched.running + sched.waiting}:
            break
    else:
        raise AssertionError("the line did not finish beside the interactive stream")
    # One chunk per BACKGROUND_PATIENCE steps passed over, no more.
    assert steps_with_a_chunk == [BACKGROUND_PATIENCE, 2 * BACKGROUND_PATIENCE + 1]


# -- on the model ----------------------------------------------------------------------------


def background(req: EngineCoreRequest) -> EngineCoreRequest:
    return msgspec.structs.replace(req, background=True)


def recorded(core: EngineCore) -> list[ScheduledBatch]:
    """Every batch the core's scheduler hands out from now on."""
    batches: list[ScheduledBatch] = []
    schedule = core.scheduler.schedule

    def recording() -> ScheduledBatch:
        batches.append(schedule())
        return batches[-1]

    core.scheduler.schedule = recording  # type: ignore[method-assign]
    return batches


def test_an_interactive_request_beside_a_running_batch_on_the_model(tiny_model_dir: Path) -> None:
    """Default flags (fcfs): four lines run; an interactive request arriving gets its first
    token from the very next step, which computes nothing else, and a token every step after,
    with at most BACKGROUND_ROWS background decode rows and no background prefill beside it;
    every request's tokens equal a run without the batch's yielding (all interactive)."""
    prompts = random_prompts([30, 35, 40, 45, 20], seed=21)
    lines = [request(f"b{i}", p, max_tokens=30, ignore_eos=True) for i, p in enumerate(prompts)]
    [prompt] = random_prompts([25], seed=22)
    interactive = request("i", prompt, max_tokens=12, ignore_eos=True)
    expected = run(make_core(tiny_model_dir, max_num_seqs=8), [*lines, interactive])

    core = make_core(tiny_model_dir, max_num_seqs=8)
    got: dict[str, Finished] = {r.request_id: Finished() for r in [*lines, interactive]}
    for r in lines:
        core.add_request(background(r))
    while len(core.scheduler.running) < 5:  # the last still prefilling, in short chunks
        for out in core.step().outputs:
            got[out.request_id].take(out)
    batches = recorded(core)
    core.add_request(interactive)
    first = core.step()
    assert [o.request_id for o in first.outputs] == ["i"]  # its first token, nothing else
    assert [s.request_id for s in batches[0].seqs] == ["i"]
    for out in first.outputs:
        got[out.request_id].take(out)
    while got["i"].finish_reason is None:
        outputs = core.step().outputs
        assert "i" in [o.request_id for o in outputs]  # a token every step
        batch = batches[-1]
        others = [(s, n) for s, n in zip(batch.seqs, batch.num_tokens) if s.request_id != "i"]
        assert len(others) <= BACKGROUND_ROWS and all(n == 1 for _, n in others)
        for out in outputs:
            got[out.request_id].take(out)
    while core.has_work():
        for out in core.step().outputs:
            got[out.request_id].take(out)
    for rid, want in expected.items():
        assert got[rid].token_ids == want.token_ids, rid
        assert got[rid].finish_reason == "length"
    assert core.scheduler.num_priority_preemptions == 0
    stats = core.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and not core.requests
