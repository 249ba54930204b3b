"""The scheduler: which sequences run in the next step, and how many tokens each.

What it owns: the waiting queue (a heap ordered by priority, then arrival), the running list,
and the step's token budget. Each step it gives every running sequence that is decoding its one
token first, then continues running prefills in chunks, then admits waiting sequences (after a
prefix-cache lookup) while the budget, `max_num_seqs` and the free blocks allow. When a running
sequence cannot get a block, the running sequence that comes last in scheduling order is
preempted: its blocks are freed and it goes back to the waiting queue to be recomputed later
(its full blocks usually survive in the prefix cache, so the recompute is cheap).

With priority scheduling (`preempt_for_priority`), a waiting sequence that finds no seat (the
batch holds `max_num_seqs`) or no blocks preempts the least urgent running sequence, as long as
that one's `priority` is strictly worse (a larger value): vLLM's priority scheduler does the
same. Ties never preempt, so sequences of one priority (fcfs, or a re-queued victim meeting
later arrivals) never thrash. The victim, scheduled earlier in this step or not, leaves the
batch and gives its tokens back to the budget; it keeps its output tokens and later resumes by
recomputing prompt and output, so its stream only pauses.

A waiting sequence whose grammar is still compiling is passed over (it keeps its place). A
running sequence with drafts (jump-forward) computes them with its new token, all in one chunk:
when the budget is short, it drops the drafts that do not fit. After the step, `update` commits
what the samples confirm of the drafts, one token at a time: each is checked for a finish (EOS,
stop token, length) and fed to the sequence's grammar, whose end finishes it with 'stop'. A
`DEAD_END` (no token was allowed) finishes it with 'error', naming the parameter at fault.

When `prefill_cap` is set (the engine's pacing, pacing.py), a step that decodes carries at most
that many prefill tokens, so a long prompt never holds the running streams for long; when
`chunk_cap` is, at most that many of any one prompt that arrived after one of the step's
streams began decoding. A prompt is not cut for streams that began after it arrived (they
came later, as a closed loop's requests that all arrive at once do: cutting their prompts
cost such a loop of long prompts 8-15% of its tok/s), nor, under priority scheduling, for
streams less urgent than it.

Background work (`Sequence.background`: a batch's lines, under any scheduling policy) runs only
with the capacity interactive sequences leave, because on a CPU a step cannot be interrupted and
its length is what an interactive request waits for. Measured on the default model (2-core
EPYC, 2 threads, one run beside other jobs): a decode step of 1-4 rows took 14-18 ms, one more
row ~1.5 ms, but any prefill chunk in it, even 8 tokens, ~28 ms and 32 tokens ~47 ms. So:
- Order: background after every interactive sequence, in the waiting queue and when blocks run
  short (its sequences are preempted first); an interactive sequence that finds no seat or no
  blocks preempts a background one, with fcfs as well (`_may_displace`).
- A step that carries an interactive prefill, or has an interactive sequence still waiting,
  carries no background work: the step that ends in an interactive first token is as long as
  without the batch.
- Beside interactive decodes, at most `BACKGROUND_ROWS` background decode rows and no
  background prefill token (a chunk would double the step).
- Alone, background prefill takes at most `BACKGROUND_CHUNK` tokens a step, so that an
  interactive request arriving meanwhile waits for a short step, not a long one.
- Never starved: once background prefill work has waited `BACKGROUND_PATIENCE` steps in a row,
  the next step takes one chunk of it whatever runs beside it (one longer step in that many).

Without chunked prefill (a pooling engine, whose prompts run whole in one step since it keeps
no K/V between steps), a waiting sequence is admitted only when its whole prompt fits the
step's remaining budget.

Invariants: a sequence is in exactly one of `waiting` and `running` until it finishes; every
scheduled sequence owns blocks for all the tokens it computes this step; the sum of scheduled
tokens never exceeds `max_num_batched_tokens`; a block is published to the prefix cache only
once it holds committed tokens (never drafts).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from trio_llm.engine.step.block_manager import BlockManager
from trio_llm.engine.step.sequence import DEAD_END, ScheduledBatch, Sequence, SequenceStatus
from trio_llm.ipc.messages import SchedulerStats

BACKGROUND_ROWS = 2
"""Background decode rows a step carries beside interactive decodes."""
BACKGROUND_CHUNK = 32
"""Background prefill tokens a step carries (only when no interactive sequence runs or waits,
or once the background has waited `BACKGROUND_PATIENCE` steps)."""
BACKGROUND_PATIENCE = 64
"""Steps background prefill work may be passed over in a row before one chunk of it runs."""


@dataclass(slots=True)
class _Room:
    """What background sequences may still take in this step."""

    rows: int
    tokens: int

    def take(self, seq: Sequence, n: int) -> int:
        """The tokens background `seq` may compute of the `n` it would: all of a decode (with
        its drafts) if a row is left, at most the tokens left of a prefill chunk; 0: none."""
        if n == 1 or seq.draft_token_ids:
            if self.rows <= 0:
                return 0
            self.rows -= 1
            return n
        n = min(n, self.tokens)
        self.tokens -= max(n, 0)
        return n


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
        preempt_for_priority: bool = False,
    ) -> None:
        self.block_manager = block_manager
        self.chunked_prefill = chunked_prefill
        self.preempt_for_priority = preempt_for_priority
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.num_preemptions = 0
        self.num_priority_preemptions = 0
        """Of those, the ones a more urgent waiting sequence made (the rest: blocks ran out)."""
        self.num_steps = 0
        self.prefix_queries = 0
        """Tokens of admitted sequences looked up in the prefix cache; hits, those found."""
        self.prefix_hits = 0
        self._removed: list[Sequence] = []
        """Sequences that left `running` since the last batch, for its `removed`."""
        self.prefill_cap: int | None = None
        """Prefill tokens a step with decodes may carry (None: the whole budget)."""
        self.chunk_cap: int | None = None
        """Tokens of one prompt a step with decodes may carry (None: the whole budget)."""
        self.last_arrival = 0
        """The latest `arrival` added (a sequence's `decoding_since` takes it)."""
        self.background_passed = 0
        """Steps in a row that passed over background prefill work (see BACKGROUND_PATIENCE)."""

    def has_work(self) -> bool:
        """Something to schedule: a running sequence, or a waiting one not held by its grammar."""
        return bool(self.running) or any(not s.awaiting_grammar for s in self.waiting)

    def add(self, seq: Sequence) -> None:
        self.last_arrival = max(self.last_arrival, seq.arrival)
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
        prefilled = 0

        # Running sequences in scheduling order: decodes first, then higher priority first.
        # A sequence short of blocks preempts the last in priority order among those not yet
        # scheduled this step, itself included.
        queue = sorted(self.running, key=lambda s: (s.num_uncomputed_tokens > 1, s.order()))
        queue.reverse()
        room = self._background_room()
        background_prefilled = 0
        while queue and budget > 0:
            seq = queue.pop()
            if seq.draft_token_ids:
                # The committed tokens first; drafts only as far as the budget goes.
                keep = budget - (seq.num_tokens - seq.num_computed_tokens)
                del seq.draft_token_ids[max(keep, 0) :]
            n = min(seq.num_uncomputed_tokens, budget)
            if seq.background:
                n = room.take(seq, n)
                if n <= 0:
                    continue  # it keeps its place: interactive sequences use this step
            if n > 1 and not seq.draft_token_ids:
                n = min(n, self._prefill_room(decodes, prefilled), self._chunk_room(seq, decodes))
                if n <= 0:
                    continue  # it keeps its place; the streams' step stays short
                prefilled += n
                if seq.background:
                    background_prefilled += n
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
                self._decoding(seq, decodes)
            else:
                prefills.append((seq, n))

        # Admit waiting sequences, unless this step already had to preempt.
        held: list[Sequence] = []
        victims: list[Sequence] = []
        while self.waiting and not preempted:
            seq = self.waiting[0]
            if any(seq is v for v in victims):
                break  # it just gave way, and nothing after it in the queue is more urgent
            if seq.awaiting_grammar:
                held.append(heapq.heappop(self.waiting))
                continue
            if budget <= 0:
                # Spent on running sequences: a less urgent one scheduled this step gives way.
                freed = self._preempt_for(seq, decodes, prefills, victims, scheduled_only=True)
                if freed is None:
                    break
                budget += freed
                continue
            if len(self.running) >= self.max_num_seqs:
                freed = self._preempt_for(seq, decodes, prefills, victims)
                if freed is None:
                    break
                budget += freed
                continue
            cached = self.block_manager.cached_prefix(seq)
            num_cached = len(cached) * self.block_manager.block_size
            n = min(
                seq.num_tokens - num_cached,
                budget,
                self._prefill_room(decodes, prefilled),
                self._chunk_room(seq, decodes),
            )
            if seq.background and n > 0:
                n = room.take(seq, n)  # behind it in the heap: background only
            if n <= 0:
                break
            if n < seq.num_tokens - num_cached and not self.chunked_prefill:
                break  # the whole prompt waits for a step with room for it
            if not self.block_manager.can_allocate(seq, n, cached):
                freed = self._preempt_for(seq, decodes, prefills, victims)
                if freed is None:
                    break
                budget += freed
                continue
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
            prefilled += n
            if seq.background and n > 1:
                background_prefilled += n
            if n == 1:
                self._decoding(seq, decodes)
            else:
                prefills.append((seq, n))
        for seq in held:
            heapq.heappush(self.waiting, seq)
        if background_prefilled or not self._background_prefill_pending():
            self.background_passed = 0
        else:
            self.background_passed += 1

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

    def _preempt_for(
        self,
        seq: Sequence,
        decodes: list[Sequence],
        prefills: list[tuple[Sequence, int]],
        victims: list[Sequence],
        *,
        scheduled_only: bool = False,
    ) -> int | None:
        """Make room for waiting `seq` by preempting the least urgent running sequence (of those
        scheduled this step, with `scheduled_only`: it is budget that is short), if `seq` may
        displace it (`_may_displace`); returns the tokens it had been given this step (0 when
        none), or None when nothing may give way; the victim joins `victims`. A sequence
        admitted in this step is never the victim: it came off the heap before `seq`, so it is
        at least as urgent."""
        given = {id(s): 1 for s in decodes} | {id(s): n for s, n in prefills}
        candidates = [s for s in self.running if id(s) in given] if scheduled_only else self.running
        victim = max(candidates, key=Sequence.order, default=None)
        if victim is None or not self._may_displace(seq, victim):
            return None
        freed = given.get(id(victim), 0)
        if victim in decodes:
            decodes.remove(victim)
        prefills[:] = [(s, n) for s, n in prefills if s is not victim]
        self._preempt(victim)
        victims.append(victim)
        self.num_priority_preemptions += 1
        return freed

    def _may_displace(self, seq: Sequence, victim: Sequence) -> bool:
        """Whether waiting `seq` may preempt running `victim`: an interactive sequence always
        displaces a background one; with priority scheduling, a strictly more urgent one
        displaces a less urgent one of its class. Ties never do, so they never thrash."""
        if victim.background != seq.background:
            return victim.background
        return self.preempt_for_priority and victim.priority > seq.priority

    def _background_room(self) -> _Room:
        """What background sequences may take in this step (the module docstring's rules)."""
        unlimited = self.max_num_batched_tokens
        # A prompt that runs whole (pooling) cannot be cut to a chunk: it takes what it needs.
        chunk = BACKGROUND_CHUNK if self.chunked_prefill else unlimited
        if self.background_passed >= BACKGROUND_PATIENCE:
            return _Room(rows=BACKGROUND_ROWS, tokens=chunk)
        if any(not s.background and not s.awaiting_grammar for s in self.waiting):
            return _Room(rows=0, tokens=0)
        interactive = [s for s in self.running if not s.background]
        if not interactive:
            return _Room(rows=unlimited, tokens=chunk)
        if any(s.num_uncomputed_tokens > 1 and not s.draft_token_ids for s in interactive):
            return _Room(rows=0, tokens=0)
        return _Room(rows=BACKGROUND_ROWS, tokens=0)

    def _background_prefill_pending(self) -> bool:
        """A background sequence waits to be admitted or has prompt tokens left to compute."""
        return any(s.background and not s.awaiting_grammar for s in self.waiting) or any(
            s.background and s.num_uncomputed_tokens > 1 and not s.draft_token_ids
            for s in self.running
        )

    def _prefill_room(self, decodes: list[Sequence], prefilled: int) -> int:
        """Prefill tokens this step may still take (`prefill_cap` applies beside decodes)."""
        if self.prefill_cap is None or not decodes:
            return self.max_num_batched_tokens
        return self.prefill_cap - prefilled

    def _decoding(self, seq: Sequence, decodes: list[Sequence]) -> None:
        """`seq` decodes this step; the first time, it notes the latest arrival it began after
        (`_chunk_room` reads it)."""
        if seq.decoding_since is None:
            seq.decoding_since = self.last_arrival
        decodes.append(seq)

    def _chunk_room(self, seq: Sequence, decodes: list[Sequence]) -> int:
        """Tokens of `seq`'s prompt this step may take: `chunk_cap` applies beside a stream
        that was decoding when `seq` arrived, unless priority scheduling makes `seq` more
        urgent than it (it may preempt it outright, so it may hold it for a longer step)."""
        if self.chunk_cap is None:
            return self.max_num_batched_tokens
        for d in decodes:
            earlier = d.decoding_since is not None and d.decoding_since < seq.arrival
            if earlier and not (self.preempt_for_priority and seq.priority < d.priority):
                return self.chunk_cap
        return self.max_num_batched_tokens

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        seq.draft_token_ids.clear()
        self._removed.append(seq)
        self.block_manager.deallocate(seq)
        self.num_preemptions += 1
        self.add(seq)

    def update(
        self,
        batch: ScheduledBatch,
        sampled: list[int | None],
        draft_samples: dict[int, list[int]] | None = None,
    ) -> list[tuple[Sequence, int]]:
        """Advance each scheduled sequence by its computed tokens and commit what was sampled
        (None for a prefill chunk that did not reach the end of its tokens). A sequence with
        drafts has its draft rows' samples in `draft_samples` (by batch index) and commits what
        `accept_drafts` keeps. Returns each sequence that committed tokens and how many, some
        of them now finished."""
        self.num_steps += 1
        out: list[tuple[Sequence, int]] = []
        bm = self.block_manager
        for i, (seq, n, token) in enumerate(zip(batch.seqs, batch.num_tokens, sampled)):
            if token is None:
                seq.num_computed_tokens += n
                bm.cache_full_blocks(seq)
                continue
            drafts = seq.draft_token_ids
            if drafts:
                assert draft_samples is not None
                new = accept_drafts(drafts, [*draft_samples[i], token])
                drafts.clear()
            else:
                new = [token]
            # Every committed token but the last has its K/V now (a rejected draft's are
            # overwritten when its replacement is computed).
            computed = seq.num_tokens + len(new) - 1
            reason = None
            committed = 0
            for t in new:
                if t == DEAD_END:
                    reason = _dead_end(seq)
                    break
                seq.token_ids.append(t)
                committed += 1
                reason = self._finish_reason(seq, t)
                if reason is not None:
                    break
            seq.num_computed_tokens = min(computed, seq.num_tokens)
            bm.cache_full_blocks(seq)
            out.append((seq, committed))
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
        if seq.grammar is not None:
            if not seq.grammar.accept([token]):
                seq.error = f"the output left its grammar: {seq.grammar.error}"
                return "error"
            if seq.grammar.is_terminated():
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


def _dead_end(seq: Sequence) -> str:
    """Fail `seq`, whose next token nothing allowed: say why and which parameter did it."""
    params = seq.params
    others = [
        name
        for name, given in (
            ("allowed_token_ids", params.allowed_token_ids),
            ("bad_words", params.bad_words_token_ids),
            ("min_tokens", seq.num_output_tokens < params.min_tokens),
        )
        if given
    ]
    if seq.grammar is not None:
        seq.error_param = "constraint"
        seq.error = seq.grammar.dead_end(others)
    else:
        seq.error_param = others[0] if others else "logit_bias"
        seq.error = f"no token may be generated here: {' and '.join(others)} exclude every token"
    return "error"


def accept_drafts(drafts: list[int], samples: list[int]) -> list[int]:
    """The tokens a step commits for a sequence with drafts: the drafts up to the first one its
    row's sample disagrees with, then that row's sample (all drafts and the last row's sample
    when none disagrees). `samples` has one entry per draft and one for the last row."""
    for i, (draft, sample) in enumerate(zip(drafts, samples)):
        if sample != draft:
            return [*drafts[:i], sample]
    return [*drafts, samples[len(drafts)]]
