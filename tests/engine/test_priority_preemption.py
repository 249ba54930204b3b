"""Priority preemption (`--scheduling-policy priority`): a more urgent waiting request takes the
seat, the blocks or the budget of the least urgent running one, which resumes later by
recomputing and yields the same tokens as if it had never been interrupted. First on plain
sequences (no model), then on the tiny model's EngineCore."""

from __future__ import annotations

from pathlib import Path

from engine_helpers import Finished, make_core, random_prompts, request, run

from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.core import EngineCore
from trio_llm.engine.step.scheduler import Scheduler
from trio_llm.engine.step.sequence import Sequence, SequenceStatus
from trio_llm.sampling_params import SamplingParams

BS = 4


def seq(n: int, rid: str, priority: int, arrival: int) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=[1] * n,
        params=SamplingParams(temperature=0.0),
        max_tokens=100,
        priority=priority,
        arrival=arrival,
    )


def scheduler(
    num_blocks: int = 64, budget: int = 64, max_seqs: int = 2, preempt: bool = True
) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, BS, enable_prefix_caching=False),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=frozenset({0}),
        max_model_len=1000,
        preempt_for_priority=preempt,
    )


def step(sched: Scheduler) -> list[str]:
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
    return [s.request_id for s in batch.seqs]


def fill(sched: Scheduler, priority: int = 5) -> None:
    """Two running sequences of `priority`, decoding."""
    sched.add(seq(5, "a", priority, 0))
    sched.add(seq(5, "b", priority, 1))
    assert step(sched) == ["a", "b"]


def test_an_urgent_request_takes_the_seat_of_the_least_urgent() -> None:
    sched = scheduler()
    fill(sched)
    sched.add(seq(6, "urgent", -1, 2))
    # "b" (the later of two equals) leaves the batch; "urgent" prefills in this same step.
    assert step(sched) == ["a", "urgent"]
    assert sched.num_priority_preemptions == sched.num_preemptions == 1
    [b] = sched.waiting
    assert b.request_id == "b" and b.status is SequenceStatus.WAITING
    assert b.num_output_tokens == 1 and b.num_computed_tokens == 0 and b.block_table == []
    # It comes back, by recomputing prompt and output, once a seat is free.
    sched.finish(next(s for s in sched.running if s.request_id == "a"), "length")
    assert step(sched) == ["urgent", "b"]
    assert b.num_output_tokens == 2


def test_equals_and_later_requests_never_preempt() -> None:
    for priority in (5, 6):  # as urgent as those running, or less
        sched = scheduler()
        fill(sched)
        sched.add(seq(6, "waiting", priority, 2))
        assert step(sched) == ["a", "b"]
        assert sched.num_preemptions == 0


def test_without_priority_scheduling_nothing_is_preempted_for_urgency() -> None:
    sched = scheduler(preempt=False)
    fill(sched)
    sched.add(seq(6, "urgent", -1, 2))
    assert step(sched) == ["a", "b"]
    assert sched.num_preemptions == 0


def test_an_urgent_request_takes_blocks_when_the_cache_is_full() -> None:
    # Seats for three, blocks for two 7-token prompts (two blocks each) and little more.
    sched = scheduler(num_blocks=5, max_seqs=3)
    sched.add(seq(7, "a", 5, 0))
    sched.add(seq(7, "b", 5, 1))
    assert step(sched) == ["a", "b"]
    sched.add(seq(7, "urgent", 0, 2))
    assert step(sched) == ["a", "urgent"]
    assert [s.request_id for s in sched.waiting] == ["b"]
    assert sched.num_priority_preemptions == 1


def test_an_urgent_request_takes_the_budget_of_a_long_prefill() -> None:
    sched = scheduler(budget=16, max_seqs=4)
    sched.add(seq(200, "long", 5, 0))
    assert step(sched) == ["long"]  # the first 16 of its 200 tokens
    sched.add(seq(6, "urgent", 0, 1))
    assert step(sched) == ["urgent"]
    assert sched.num_priority_preemptions == 1
    assert sched.waiting[0].request_id == "long"


# -- on the model ----------------------------------------------------------------------------


def test_preempted_output_is_the_same_and_the_urgent_one_starts_at_once(
    tiny_model_dir: Path,
) -> None:
    """Two long greedy requests fill a batch of two; an urgent one arrives mid-way and has its
    first token from the very next step; every request's tokens equal a run without
    preemption, and the preempted one's stream has neither a gap nor a repeat."""
    background = random_prompts([30, 40], seed=11)
    [urgent_prompt] = random_prompts([25], seed=12)
    bg = [
        request(f"bg{i}", p, priority=1, max_tokens=40, ignore_eos=True)
        for i, p in enumerate(background)
    ]
    urgent = request("urgent", urgent_prompt, priority=-1, max_tokens=10, ignore_eos=True)
    roomy = make_core(tiny_model_dir, max_num_seqs=4, scheduling_policy="priority")
    expected = run(roomy, [*bg, urgent])
    assert roomy.stats().num_preemptions == 0

    core = make_core(tiny_model_dir, max_num_seqs=2, scheduling_policy="priority")
    got: dict[str, Finished] = {r.request_id: Finished() for r in [*bg, urgent]}
    for r in bg:
        core.add_request(r)
    for _ in range(10):  # both past their prefill and decoding
        for out in core.step().outputs:
            got[out.request_id].take(out)
    assert len(core.scheduler.running) == 2
    core.add_request(urgent)
    first = core.step()
    assert "urgent" in [o.request_id for o in first.outputs]  # its first token, one step on
    assert core.scheduler.num_priority_preemptions == 1
    for out in first.outputs:
        got[out.request_id].take(out)
    while core.has_work():
        for out in core.step().outputs:
            got[out.request_id].take(out)
    for rid, want in expected.items():
        assert got[rid].token_ids == want.token_ids, rid
        assert got[rid].finish_reason == "length"
    assert len(got["bg1"].token_ids) == 40
    stats = core.stats()
    assert stats.num_free_blocks == stats.num_total_blocks and not core.requests


def test_fcfs_engine_never_preempts_for_priority(tiny_model_dir: Path) -> None:
    core: EngineCore = make_core(tiny_model_dir, max_num_seqs=1)
    prompts = random_prompts([10, 12], seed=13)
    results = run(core, [request(str(i), p, max_tokens=6) for i, p in enumerate(prompts)])
    assert all(r.finish_reason is not None for r in results.values())
    assert core.scheduler.num_priority_preemptions == 0
