"""The block manager and the scheduler on plain sequences (no model): reference counts, the
prefix cache and its LRU eviction, and who gets preempted."""

from __future__ import annotations

import pytest

from trio_llm.engine.step import block_manager
from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.scheduler import Scheduler
from trio_llm.engine.step.sequence import Sequence, SequenceStatus
from trio_llm.sampling_params import SamplingParams

BS = 4


def seq(tokens: list[int], rid: str = "r", priority: int = 0, arrival: int = 0) -> Sequence:
    return Sequence(
        request_id=rid,
        token_ids=list(tokens),
        params=SamplingParams(temperature=0.0),
        max_tokens=100,
        priority=priority,
        arrival=arrival,
    )


def compute(bm: BlockManager, s: Sequence) -> None:
    """What a step does for a whole prompt: allocate, 'compute', publish full blocks."""
    cached = bm.cached_prefix(s)
    bm.allocate(s, s.num_tokens - len(cached) * BS, cached)
    s.num_computed_tokens = s.num_tokens
    bm.cache_full_blocks(s)


def test_a_shared_prefix_is_served_from_the_same_blocks() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a = seq(list(range(10)))
    compute(bm, a)
    assert len(a.block_table) == 3 and bm.num_free_blocks == 13
    b = seq([*range(8), 99, 98, 97])
    hits = bm.cached_prefix(b)
    assert hits == a.block_table[:2]
    bm.allocate(b, b.num_tokens - 8, hits)
    assert b.num_computed_tokens == 8
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert [bm.blocks[i].ref_count for i in a.block_table] == [2, 2, 1]
    bm.deallocate(a)
    bm.deallocate(b)
    assert bm.num_free_blocks == 16


def test_at_least_one_token_is_left_to_compute() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    compute(bm, seq(list(range(8))))
    again = seq(list(range(8)))
    assert len(bm.cached_prefix(again)) == 1  # the last block holds the token to recompute


def test_freed_cached_blocks_survive_until_the_pool_runs_dry_then_go_lru() -> None:
    bm = BlockManager(6, BS, enable_prefix_caching=True)
    old, new = seq(list(range(9)), "old"), seq(list(range(100, 109)), "new")
    compute(bm, old)
    bm.deallocate(old)
    compute(bm, new)
    bm.deallocate(new)
    assert bm.num_free_blocks == 6
    # Both prefixes are still cached.
    assert len(bm.cached_prefix(seq(list(range(9))))) == 2
    assert len(bm.cached_prefix(seq(list(range(100, 109))))) == 2
    # Four fresh blocks: the two empty ones first, then the least recently freed ("old").
    hog = seq(list(range(200, 216)), "hog")
    bm.allocate(hog, 16)
    assert bm.cached_prefix(seq(list(range(9)))) == []
    assert len(bm.cached_prefix(seq(list(range(100, 109))))) == 2


def test_a_hash_collision_never_serves_other_tokens() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=True)
    a = seq([1, 2, 3, 4, 5])
    compute(bm, a)
    b = seq([9, 9, 9, 9, 5])
    b.block_hashes.append(a.block_hashes[0])  # force the same hash for different tokens
    assert bm.cached_prefix(b) == []


def test_without_prefix_caching_nothing_is_shared() -> None:
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    compute(bm, seq(list(range(9))))
    assert bm.cached_prefix(seq(list(range(9)))) == []
    assert bm.hash_to_block == {}


def scheduler(num_blocks: int, budget: int = 64, max_seqs: int = 8) -> Scheduler:
    return Scheduler(
        BlockManager(num_blocks, BS, enable_prefix_caching=False),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=budget,
        eos_token_ids=frozenset({0}),
        max_model_len=1000,
    )


def step(sched: Scheduler) -> list[str]:
    batch = sched.schedule()
    sched.update(
        batch,
        [
            7 if s.num_computed_tokens + n == s.num_tokens else None
            for s, n in zip(batch.seqs, batch.num_tokens)
        ],
    )
    return [s.request_id for s in batch.seqs]


def test_decodes_come_first_and_prefills_fill_the_budget_in_chunks() -> None:
    sched = scheduler(64, budget=10)
    sched.add(seq([1] * 3, "short", arrival=0))
    sched.add(seq([1] * 25, "long", arrival=1))
    assert step(sched) == ["short", "long"]  # 3 + 7 tokens
    batch = sched.schedule()
    assert [s.request_id for s in batch.seqs] == ["short", "long"]
    assert batch.num_tokens == [1, 9] and batch.num_decodes == 1


def test_preemption_takes_the_last_in_priority_order_and_it_comes_back() -> None:
    sched = scheduler(6, budget=64)
    for rid, prio, arrival in [("low", 5, 0), ("high", 0, 1), ("mid", 1, 2)]:
        sched.add(seq([1] * 7, rid, priority=prio, arrival=arrival))
    # 6 blocks of 4: the three 7-token prompts take two blocks each.
    assert sorted(step(sched)) == ["high", "low", "mid"]
    # The eighth position still fits the second block; the ninth needs a third: "low" (the
    # lowest priority) gives way, to "high" first.
    step(sched)
    assert sched.num_preemptions == 0
    assert step(sched) == ["high", "mid"]
    assert sched.num_preemptions == 1
    low = next(s for s in sched.waiting if s.request_id == "low")
    assert low.status is SequenceStatus.WAITING and low.block_table == []
    assert low.num_computed_tokens == 0 and low.num_output_tokens == 2  # tokens kept
    while sched.has_work() and sched.num_steps < 100:
        for s in list(sched.running):
            if s.num_output_tokens >= 3 and s.num_computed_tokens == s.num_tokens:
                sched.finish(s, "length")
        step(sched)
    assert sched.block_manager.num_free_blocks == 6


def test_a_cached_block_is_matched_by_its_whole_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even when two chains hash alike (here: a hash that ignores the chain, the worst case of a
    collision), a block is served only to a prompt whose earlier blocks are the ones it was
    computed after."""
    monkeypatch.setattr(block_manager, "chain_hash", lambda parent, tokens: hash(tuple(tokens)))
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    a, b, c, e = [0, 1, 2, 3], [10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]
    compute(bm, seq([*a, *c, 99]))  # C's K/V were computed after A
    compute(bm, seq([*b, *e, 99]))
    asking = seq([*b, *c, 99])  # B is cached, and so are C's tokens, but after A, not B
    hits = bm.cached_prefix(asking)
    assert len(hits) == 1


def test_a_prefix_computed_twice_is_published_once() -> None:
    bm = BlockManager(16, BS, enable_prefix_caching=True)
    first, second = seq([*range(8), 99], "first"), seq([*range(8), 98], "second")
    for s in (first, second):  # both computed their prefix without finding the other's
        bm.allocate(s, s.num_tokens)
    for s in (first, second):
        s.num_computed_tokens = s.num_tokens
        bm.cache_full_blocks(s)
    assert bm.cached_prefix(seq([*range(8), 97])) == first.block_table[:2]
    copies = list(second.block_table)
    bm.deallocate(second)
    # Its unpublished copies went to the front of the free queue: they are handed out first,
    # before any block that holds a cached prefix.
    assert list(bm.free)[: len(copies)] == copies


def salted(tokens: list[int], salt: str | None, rid: str = "r") -> Sequence:
    s = seq(tokens, rid)
    s.cache_root = block_manager.salt_root(salt)
    return s


def test_blocks_are_shared_only_between_requests_with_the_same_cache_salt() -> None:
    bm = BlockManager(32, BS, enable_prefix_caching=True)
    prompt = list(range(9))
    compute(bm, salted(prompt, "tenant-a"))
    assert len(bm.cached_prefix(salted(prompt, "tenant-a"))) == 2
    assert bm.cached_prefix(salted(prompt, "tenant-b")) == []
    assert bm.cached_prefix(salted(prompt, None)) == []
    compute(bm, salted(prompt, None))
    assert len(bm.cached_prefix(salted(prompt, None))) == 2
    assert bm.cached_prefix(salted(prompt, "tenant-b")) == []


class RecordedEvents:
    def __init__(self) -> None:
        self.log: list[tuple[str, int, int | None]] = []

    def stored(
        self,
        block_hash: int,
        parent_hash: int | None,
        token_ids: tuple[int, ...],
        adapter: tuple[int, str] | None = None,
        extra_keys: tuple[str, ...] | None = None,
    ) -> None:
        self.log.append(("stored", block_hash, parent_hash))

    def removed(self, block_hash: int) -> None:
        self.log.append(("removed", block_hash, None))


def test_every_publication_and_eviction_is_reported_in_order() -> None:
    events = RecordedEvents()
    bm = BlockManager(4, BS, enable_prefix_caching=True, events=events)
    first = seq(list(range(9)), "first")
    compute(bm, first)  # two full blocks published, chained
    (_, h0, p0), (_, h1, p1) = events.log
    assert p0 is None and p1 == h0
    bm.deallocate(first)
    events.log.clear()
    compute(bm, seq([50 + t for t in range(9)], "other"))  # the pool runs dry: one is evicted
    kinds = [kind for kind, _, _ in events.log]
    assert kinds == ["removed", "stored", "stored"]
    assert events.log[0][1] in (h0, h1)
