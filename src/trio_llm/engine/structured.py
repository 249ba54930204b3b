"""Structured outputs in the engine: compile each request's constraint off the step loop, fill
one bitmask per step for the constrained rows, advance each grammar with the tokens its request
committed, and propose the tokens the grammar forces (jump-forward).

The interface is vLLM v1's structured-output manager in small: `compile` (a future, resolved in
a worker thread), the bitmask of a step (`start_masks`, filled in a second thread while the
model runs), `Grammar.accept`, `Grammar.is_terminated` (`Grammar`, one request's matcher, is
trio_llm/grammar.py's). There is no rollback: the matcher only ever holds a request's committed
tokens. Draft tokens never enter it, and preemption keeps a sequence's tokens, so neither has
anything to undo.

Jump-forward is speculative decoding with the grammar as the drafter. When the grammar forces a
continuation (the keys and punctuation a schema fixes), those tokens become the sequence's
drafts: the next step computes them as one chunk with the token just sampled, samples every
draft position under its own mask, and keeps the drafts up to the first position whose sample
differs, plus that sample (or the sample after the last draft; `scheduler.accept_drafts`). A
point-mass proposal accepted exactly when the sample equals it leaves the output distribution
unchanged, so the output is
the one token-by-token decoding gives: the same tokens for greedy requests, the same
distribution for sampled ones (a seeded one draws its noise per row, so it may take another,
equally likely, path). Requests with penalties or min_tokens get no drafts: those read the
output so far, which the rows of one chunk do not each see.

Invariants: a request whose grammar is compiling is never scheduled; an aborted one's compile
result is dropped. The step's masks are filled before its sampling reads them and never while
a matcher is being advanced (`StepMasks.wait` is called before the step's update).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import llguidance
import numpy as np
import torch
from llguidance import LLMatcher

from trio_llm.constraint import Constraint
from trio_llm.grammar import ConstraintError, Grammar, grammar_text, llg_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trio_llm.engine.sequence import ScheduledBatch, Sequence

log = logging.getLogger(__name__)

MAX_DRAFT_TOKENS = 32
"""Forced tokens proposed at once; a longer forced run continues after the next step."""
CACHE_SIZE = 64
"""Compiled grammars kept (least recently used evicted); a new request copies one."""


@dataclass(slots=True)
class StepMasks:
    """The bitmask of one step's constrained sample rows, being filled in the mask thread."""

    bitmask: np.ndarray
    """[R, ceil(V / 32)] int32: bit t of row r set when token t is allowed there."""
    rows: np.ndarray
    """[R] int64: the step's sample row each bitmask row belongs to."""
    done: Future[None]

    def wait(self) -> None:
        """Return once the bitmask is filled (re-raises what went wrong filling it)."""
        self.done.result()


class StructuredOutputs:
    """The engine's grammar side: compile threads, the grammar cache, the step's masks."""

    def __init__(
        self,
        load_tokenizer: Callable[[], PreTrainedTokenizerBase],
        vocab_size: int,
        eos_token_ids: frozenset[int],
        *,
        jump_forward: bool = True,
    ) -> None:
        self._load_tokenizer = load_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.jump_forward = jump_forward
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._tokenizer_lock = threading.Lock()
        self._cache: OrderedDict[Constraint, LLMatcher] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Two threads, so that a step's masks never wait behind a slow compile; both spend
        # their time in llguidance, which releases the GIL.
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._executor: llguidance.LLExecutor | None = None
        self.words = (vocab_size + 31) // 32

    # -- compile --------------------------------------------------------------------------

    def compile(self, constraint: Constraint) -> Future[Grammar]:
        """The request's grammar, compiled in the compile thread (the first one also builds
        llguidance's view of the vocabulary, about a second)."""
        return self._compiler.submit(self._compile, constraint)

    def _compile(self, constraint: Constraint) -> Grammar:
        with self._cache_lock:
            template = self._cache.get(constraint)
            if template is not None:
                self._cache.move_to_end(constraint)
        if template is None:
            text = grammar_text(constraint)
            template = LLMatcher(self.tokenizer(), text, log_level=0)
            if template.is_error():
                raise ConstraintError(template.get_error().split("\n<state>", 1)[0])
            with self._cache_lock:
                self._cache[constraint] = template
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        return Grammar(template.deep_copy())

    def tokenizer(self) -> llguidance.LLTokenizer:
        with self._tokenizer_lock:
            if self._tokenizer is None:
                self._tokenizer = llg_tokenizer(
                    self._load_tokenizer(), self.vocab_size, sorted(self.eos_token_ids)
                )
            return self._tokenizer

    # -- masks ----------------------------------------------------------------------------

    def start_masks(self, batch: ScheduledBatch) -> StepMasks | None:
        """Begin filling the masks of the batch's constrained sample rows (rows laid out as
        `Sequence.sample_rows` says: each sampling sequence's draft rows, then its last row);
        None when no sampling sequence is constrained."""
        jobs: list[tuple[LLMatcher, int, list[int]]] = []
        rows: list[int] = []
        row = 0
        for seq, n in zip(batch.seqs, batch.num_tokens):
            count = seq.num_sample_rows(n)
            if count and seq.grammar is not None:
                jobs.append((seq.grammar.matcher, len(rows), list(seq.draft_token_ids)))
                rows.extend(range(row, row + count))
            row += count
        if not jobs:
            return None
        bitmask = np.zeros((len(rows), self.words), dtype=np.int32)
        done = self._masker.submit(self._fill, jobs, bitmask)
        return StepMasks(bitmask, np.asarray(rows, dtype=np.int64), done)

    def _fill(self, jobs: list[tuple[LLMatcher, int, list[int]]], bitmask: np.ndarray) -> None:
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        # llguidance spreads the matchers over its own threads and, for a sequence with
        # drafts, fills the mask after each draft too (that call refuses empty draft lists).
        pointer, size, rows = bitmask.ctypes.data, self.words * 4, bitmask.shape[0]
        plain = [(matcher, row) for matcher, row, drafts in jobs if not drafts]
        drafting = [job for job in jobs if job[2]]
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, pointer, size, rows)
        if drafting:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafting, pointer, size, rows)

    # -- after the step -------------------------------------------------------------------

    def propose_drafts(self, seq: Sequence, max_model_len: int) -> None:
        """Give `seq` the tokens its grammar forces next, as drafts for the next step."""
        params = seq.params
        if (
            not self.jump_forward
            or seq.grammar is None
            or params.min_tokens > seq.num_output_tokens
            or params.presence_penalty
            or params.frequency_penalty
            or params.repetition_penalty != 1.0
        ):
            return
        # Room for the drafts and the token sampled after them.
        room = min(
            MAX_DRAFT_TOKENS,
            seq.max_tokens - seq.num_output_tokens - 1,
            max_model_len - seq.num_tokens - 1,
        )
        if room <= 0:
            return
        forced = seq.grammar.forced_tokens()
        if forced:
            seq.draft_token_ids[:] = forced[:room]

    def close(self) -> None:
        self._compiler.shutdown(wait=False, cancel_futures=True)
        self._masker.shutdown(wait=False, cancel_futures=True)


def apply_bitmask(logits: torch.Tensor, masks: StepMasks) -> None:
    """Set the logits of disallowed tokens to -inf on the constrained rows, in one vectorized
    operation over the batch (the Triton kernel on CUDA, torch on CPU)."""
    from trio_llm.kernels.token_bitmask import apply_token_bitmask

    masks.wait()
    bitmask = torch.from_numpy(masks.bitmask)
    rows = torch.from_numpy(masks.rows)
    if logits.device.type != "cpu":
        bitmask = bitmask.to(logits.device, non_blocking=True)
        rows = rows.to(logits.device, non_blocking=True)
    apply_token_bitmask(logits, bitmask, rows)
