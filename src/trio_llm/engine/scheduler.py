"""The scheduler: which sequences run in the next step, and how many tokens each.

What it owns: the waiting queue (a heap ordered by priority, then arrival), the running list,
and the step's token budget. Each step it gives every running sequence that is decoding its one
token first, then continues running prefills in chunks, then admits waiting sequences (after a
prefix-cache lookup) while the budget, `max_num_seqs` and the free blocks allow. When a running
sequence cannot get a block, the running sequence that comes last in scheduling order is
preempted: its blocks are freed and it goes back to the waiting queue to be recomputed later
(its full blocks usually survive in the prefix cache, so the recompute is cheap).

Without chunked prefill (a pooling engine, whose prompts run whole in one step since it keeps
no K/V between steps), a waiting sequence is admitted only when its whole prompt fits the
step's remaining budget.

Invariants: a sequence is in exactly one of `waiting` and `running` until it finishes; every
scheduled sequence owns blocks for all the tokens it computes this step; the sum of scheduled
tokens never exceeds `max_num_batched_tokens`.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from trio_llm.engine.block_manager import BlockManager
from trio_llm.engine.sequence import Sequence, SequenceStatus
from trio_llm.ipc.messages import SchedulerStats


@dataclass(slots=True)
class ScheduledBatch:
    seqs: list[Sequence]
    """Decodes (one token) first, then prefill chunks."""
    num_tokens: list[int]
    """Tokens each sequence computes this step, starting at its `num_computed_tokens`."""
    num_decodes: int
    removed: list[Sequence] = field(default_factory=list)
    """Sequences that left the running set (finished, aborted, preempted) since the last
    batch: the model runner frees their rows of the persistent input batch."""

    @property
    def total_tokens(self) -> int:
        return sum(self.num_tokens)


class Scheduler:
    def __init__(
        self,
        block_manager: BlockManager,
        *,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        eos_token_ids: frozenset[int],
        max_model_len: int,
        chunked_prefill: bool = True,
    ) -> None:
        self.block_manager = block_manager
        self.chunked_prefill = chunked_prefill
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_steps = 0
        self.prefix_queries = 0
        """Tokens of admitted sequences looked up in the prefix cache; hits, those found."""
        self.prefix_hits = 0
        self._removed: list[Sequence] = []
        """Sequences that left `running` since the last batch, for its `removed`."""

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        heapq.heappush(self.waiting, seq)

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence wherever it is (finish, abort or error) and return its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
            self._removed.append(seq)
        elif seq.status is SequenceStatus.WAITING and seq in self.waiting:
            self.waiting.remove(seq)
            heapq.heapify(self.waiting)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        self.block_manager.deallocate(seq)

    # -- one step -------------------------------------------------------------------------

    def schedule(self) -> ScheduledBatch:
        budget = self.max_num_batched_tokens
        decodes: list[Sequence] = []
        prefills: list[tuple[Sequence, int]] = []
        preempted = False

        # Running sequences in scheduling order: decodes first, then higher priority first.
        # A sequence short of blocks preempts the last in priority order among those not yet
        # scheduled this step, itself included.
        queue = sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.order()))
        queue.reverse()
        while queue and budget > 0:
            seq = queue.pop()
            n = min(seq.num_uncomputed_tokens, budget)
            while not self.block_manager.can_allocate(seq, n):
                preempted = True
                victim = max(queue, key=Sequence.order, default=seq)
                if victim.order() < seq.order():
                    victim = seq
                self._preempt(victim)
                if victim is seq:
                    break
                queue.remove(victim)
            if seq.status is not SequenceStatus.RUNNING:
                continue
            self.block_manager.allocate(seq, n)
            budget -= n
            if n == 1:
                decodes.append(seq)
            else:
                prefills.append((seq, n))

        # Admit waiting sequences, unless this step already had to preempt.
        while (
            self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs
        ):
            seq = self.waiting[0]
            cached = self.block_manager.cached_prefix(seq)
            num_cached = len(cached) * self.block_manager.block_size
            n = min(seq.num_tokens - num_cached, budget)
            if n < seq.num_tokens - num_cached and not self.chunked_prefill:
                break  # the whole prompt waits for a step with room for it
            if not self.block_manager.can_allocate(seq, n, cached):
                break
            heapq.heappop(self.waiting)
            self.block_manager.allocate(seq, n, cached)
            # Findable from now on: an identical prompt admitted next, in this same step, shares
            # these blocks (this step writes their K/V before any of its tokens attend).
            self.block_manager.cache_full_blocks(seq, seq.num_computed_tokens + n)
            if seq.num_cached_tokens < 0:
                seq.num_cached_tokens = num_cached
            if self.block_manager.enable_prefix_caching:
                self.prefix_queries += seq.num_tokens
                self.prefix_hits += num_cached
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            budget -= n
            if n == 1:
                decodes.append(seq)
            else:
                prefills.append((seq, n))

        seqs = decodes + [seq for seq, _ in prefills]
        removed: list[Sequence] = []
        if seqs:  # an empty batch is never run: its removals wait for the next one
            removed, self._removed = self._removed, []
        return ScheduledBatch(
            seqs=seqs,
            num_tokens=[1] * len(decodes) + [n for _, n in prefills],
            num_decodes=len(decodes),
            removed=removed,
        )

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self._removed.append(seq)
        self.block_manager.deallocate(seq)
        self.num_preemptions += 1
        self.add(seq)

    def update(self, batch: ScheduledBatch, sampled: list[int | None]) -> list[Sequence]:
        """Advance each scheduled sequence by its computed tokens and append what was sampled
        (None for a prefill chunk that did not reach the end of its tokens). Returns the
        sequences that got a token, some of them now finished."""
        self.num_steps += 1
        out: list[Sequence] = []
        bm = self.block_manager
        for seq, n, token in zip(batch.seqs, batch.num_tokens, sampled):
            seq.num_computed_tokens += n
            bm.cache_full_blocks(seq)
            if token is None:
                continue
            seq.token_ids.append(token)
            out.append(seq)
            reason = self._finish_reason(seq, token)
            if reason is not None:
                self.finish(seq, reason)
        return out

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        # The sampler masks EOS and stop tokens until min_tokens are out; this guard keeps the
        # rule in one place should a caller bypass the sampler.
        if seq.num_output_tokens > params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return "stop"
            if token in params.stop_token_ids:
                seq.stop_reason = token
                return "stop"
        if seq.num_output_tokens >= seq.max_tokens or seq.num_tokens >= self.max_model_len:
            return "length"
        return None

    def stats(self) -> SchedulerStats:
        bm = self.block_manager
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            num_free_blocks=bm.num_free_blocks,
            num_total_blocks=bm.num_blocks,
            kv_usage=bm.usage(),
            prefix_cache_queries=self.prefix_queries,
            prefix_cache_hits=self.prefix_hits,
            num_preemptions=self.num_preemptions,
            num_steps=self.num_steps,
        )
