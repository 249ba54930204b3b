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
a matcher is being advanced (`StepMasks.wait` is called before the step's update). A mask
never allows a token its grammar refuses: a matcher that has failed gets an empty row, and a
grammar that forces a byte the model cannot produce gets a row with only a placeholder token
past the logits (`trio_llm.grammar.GrammarVocabulary`); the sampler reports either as a dead end
(`DEAD_END`) instead of sampling, and no placeholder is ever proposed as a draft.

The grammar vocabulary (about a second of work that holds the GIL in places) is built in the
compile thread as soon as the engine process starts (`prepare`), not by the first constrained
request, which would stall the running streams' steps while it is built.
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
from trio_llm.grammar import (
    ConstraintError,
    Grammar,
    GrammarVocabulary,
    clean_error,
    grammar_text,
    grammar_vocabulary,
    limits,
)
from trio_llm.thinking_budget import ThinkingBudget

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trio_llm.engine.step.sequence import ScheduledBatch, Sequence

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
        self._hf: PreTrainedTokenizerBase | None = None
        self._hf_lock = threading.Lock()
        self._vocabulary: Future[GrammarVocabulary] | None = None
        self._vocabulary_lock = threading.Lock()
        self._cache: OrderedDict[Constraint, LLMatcher] = OrderedDict()
        self._cache_lock = threading.Lock()
        # Two threads, so that a step's masks never wait behind a slow compile; both spend
        # their time in llguidance, which releases the GIL.
        self._compiler = ThreadPoolExecutor(1, thread_name_prefix="grammar-compile")
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="grammar-mask")
        self._executor: llguidance.LLExecutor | None = None

    # -- compile --------------------------------------------------------------------------

    def compile(self, constraint: Constraint) -> Future[Grammar]:
        """The request's grammar, compiled in the compile thread (after the grammar vocabulary,
        when that is not built yet)."""
        # The vocabulary's build goes first in the one compile thread (where waiting for it
        # inside a compile would wait for ever).
        vocabulary = self.prepare()
        return self._compiler.submit(self._compile, constraint, vocabulary)

    def _compile(self, constraint: Constraint, pending: Future[GrammarVocabulary]) -> Grammar:
        with self._cache_lock:
            template = self._cache.get(constraint)
            if template is not None:
                self._cache.move_to_end(constraint)
        vocabulary = pending.result()
        if template is None:
            text = grammar_text(constraint)
            template = LLMatcher(vocabulary.tokenizer, text, log_level=0, limits=limits())
            if template.is_error():
                raise ConstraintError(clean_error(template.get_error()))
            with self._cache_lock:
                self._cache[constraint] = template
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        budget = None
        if constraint.thinking is not None:
            budget = ThinkingBudget.of(constraint.thinking, self._token_bytes, self._tokenize)
        return Grammar(template.deep_copy(), vocabulary, budget)

    def prepare(self) -> Future[GrammarVocabulary]:
        """Start building the grammar vocabulary in the compile thread, if not yet started:
        the engine process does it at start-up."""
        with self._vocabulary_lock:
            if self._vocabulary is None:
                self._vocabulary = self._compiler.submit(self._build_vocabulary)
            return self._vocabulary

    def _build_vocabulary(self) -> GrammarVocabulary:
        eos = sorted(self.eos_token_ids)
        return grammar_vocabulary(self._hf_tokenizer(), self.vocab_size, eos)

    def vocabulary(self) -> GrammarVocabulary:
        """The grammar vocabulary (built on first use unless `prepare` started it; waits while
        the compile thread builds it)."""
        return self.prepare().result()

    def _token_bytes(self, token: int) -> bytes:
        return self.vocabulary().tokenizer.decode_bytes([token])

    def _tokenize(self, text: bytes) -> list[int]:
        """`text` as the model's own tokenizer writes it (a tag that is one added token stays
        one), or as llguidance does when it is not whole UTF-8."""
        try:
            decoded = text.decode("utf-8")
        except UnicodeDecodeError:
            return self.vocabulary().tokenizer.tokenize_bytes(text)
        return list(self._hf_tokenizer().encode(decoded, add_special_tokens=False))

    def _hf_tokenizer(self) -> PreTrainedTokenizerBase:
        with self._hf_lock:
            if self._hf is None:
                self._hf = self._load_tokenizer()
            return self._hf

    # -- masks ----------------------------------------------------------------------------

    def start_masks(self, batch: ScheduledBatch) -> StepMasks | None:
        """Begin filling the masks of the batch's constrained sample rows (rows laid out as
        `Sequence.sample_rows` says: each sampling sequence's draft rows, then its last row);
        None when no sampling sequence is constrained."""
        jobs: list[tuple[LLMatcher, int, list[int]]] = []
        forced: list[tuple[int, int]] = []
        """(mask row, token): a row that allows that one token (a thinking budget's tag)."""
        rows: list[int] = []
        row = 0
        for seq, n in zip(batch.seqs, batch.num_tokens):
            count = seq.num_sample_rows(n)
            if count and seq.grammar is not None:
                token = seq.grammar.forced_token()
                if token is not None and count == 1:
                    forced.append((len(rows), token))
                else:
                    jobs.append((seq.grammar.matcher, len(rows), list(seq.draft_token_ids)))
                rows.extend(range(row, row + count))
            row += count
        if not rows:
            return None
        bitmask = np.zeros((len(rows), self.vocabulary().mask_words), dtype=np.int32)
        for at, token in forced:
            bitmask[at, token // 32] = np.uint32(1 << (token % 32)).view(np.int32)
        done = self._masker.submit(self._fill, jobs, bitmask)
        return StepMasks(bitmask, np.asarray(rows, dtype=np.int64), done)

    def _fill(self, jobs: list[tuple[LLMatcher, int, list[int]]], bitmask: np.ndarray) -> None:
        if self._executor is None:
            self._executor = llguidance.LLExecutor()
        # llguidance spreads the matchers over its own threads and, for a sequence with
        # drafts, fills the mask after each draft too (that call refuses empty draft lists).
        pointer, size, rows = bitmask.ctypes.data, bitmask.shape[1] * 4, bitmask.shape[0]
        plain = [(matcher, row) for matcher, row, drafts in jobs if not drafts]
        drafting = [job for job in jobs if job[2]]
        if plain:
            self._executor.unsafe_compute_mask_ptr(plain, pointer, size, rows)
        if drafting:
            self._executor.unsafe_compute_mask_ptr_with_draft_token(drafting, pointer, size, rows)
        for matcher, row, drafts in jobs:
            if matcher.is_error():
                # A failed matcher's mask allows EOS; its rows allow nothing instead, so the
                # sampler reports the dead end and the request fails with the matcher's error.
                bitmask[row : row + len(drafts) + 1] = 0

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
