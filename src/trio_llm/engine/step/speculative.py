"""Model-free speculative decoding: n-gram prompt lookup (vLLM's `ngram`, llama.cpp's lookup).

When the last few tokens of a sequence appeared earlier in it (a quoted passage, code being
edited, a list that repeats its pattern), the tokens that followed them then are a good guess
for what follows now. They become the sequence's drafts: the next step computes them in one
chunk with the new token, samples a row per draft, and keeps the drafts up to the first one its
sample disagrees with (`scheduler.accept_drafts`, the same verification as jump-forward). The
output is exactly what decoding one token at a time gives, for greedy and sampled requests
alike (a draft is kept only where the sample at its position equals it).

When it pays: a lone stream's step on a CPU is bound by reading the weights, so a few more rows
should cost little and every accepted draft saves a step. Measured on the EPYC with the default
model in its own formats (bench/results/speculative.md), it did not pay: torch's int4 kernel
costs about twice as much for 5 rows as for 1, the drafts of a small chat model were accepted
rarely (12 of 95 steps saved when it rewrote a code snippet), and the stream got slower on
repetitive and on free text alike. Without batch invariance a draft row is also computed as
part of a chunk, whose attention rounds differently in the last bits from a one-token step's,
so a bf16 greedy stream may leave a near-tie the other way (with it, a draft's row is what a
decode computes: engine/plans/invariance.py). So `auto` is off; `on` drafts for every eligible
sequence.
"""

from __future__ import annotations

import numpy as np

from trio_llm.engine.step.sequence import Sequence

MODES = ("auto", "on", "off")
NUM_DRAFTS = 4
"""Tokens proposed per step (bench/results/speculative.md: 4 against 2 and 8)."""
MAX_NGRAM, MIN_NGRAM = 4, 2
"""The longest suffix looked up first; a single-token match guesses too often wrong."""
MAX_LOOKBACK = 4096
"""Only the last this many tokens are searched, so a long context keeps the lookup short."""


def propose(tokens: list[int] | np.ndarray, num_drafts: int = NUM_DRAFTS) -> list[int]:
    """The tokens that followed the latest earlier occurrence of the longest suffix of
    `tokens` (MAX_NGRAM down to MIN_NGRAM long), at most `num_drafts`; [] when none recurs."""
    arr = np.asarray(tokens[-MAX_LOOKBACK:], dtype=np.int64)
    length = len(arr)
    for n in range(MAX_NGRAM, MIN_NGRAM - 1, -1):
        if length <= n:
            continue
        suffix = arr[-n:]
        # Windows that start before the suffix itself and have a token after them.
        windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)
        hits = np.flatnonzero((windows == suffix).all(axis=1))
        hits = hits[hits < length - n]
        if len(hits):
            start = int(hits[-1]) + n
            return arr[start : start + num_drafts].tolist()
    return []


def resolve_mode(mode: str, *, quantized: bool) -> str:
    """`auto` is off: measured, drafting never won on the CPU path (see the module's
    docstring); `quantized` is where it would be tried first if a kernel made extra rows cheap."""
    if mode not in MODES:
        raise ValueError(f"unknown ngram_speculation {mode!r}; use {', '.join(MODES)}")
    del quantized
    return "off" if mode == "auto" else mode


def wants_drafts(mode: str, seq: Sequence, num_running: int) -> bool:
    """Whether `seq` gets n-gram drafts this step: `auto` only while it decodes alone; never
    for requests whose sampling reads the history token by token (penalties, min_tokens) or a
    grammar (which has its own drafts). A seeded request may: its draw for an output position
    is keyed by its seed and that position (engine/step/sampler.py), whichever row samples it."""
    if mode == "off" or (mode == "auto" and num_running != 1):
        return False
    params = seq.params
    return not (
        seq.is_finished
        or seq.grammar is not None
        or seq.awaiting_grammar
        or params.min_tokens > seq.num_output_tokens
        or params.presence_penalty
        or params.frequency_penalty
        or params.repetition_penalty != 1.0
    )


def propose_drafts(seq: Sequence, max_model_len: int) -> None:
    """Give `seq` n-gram drafts for its next step, within its token and context limits."""
    room = min(
        NUM_DRAFTS, seq.max_tokens - seq.num_output_tokens - 1, max_model_len - seq.num_tokens - 1
    )
    if room > 0:
        seq.draft_token_ids[:] = propose(seq.token_ids, room)
