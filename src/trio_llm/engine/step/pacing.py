"""Prefill pacing: how many prompt tokens a step may carry beside running streams.

Why: a CPU step's time grows with its tokens, and a step cannot be interrupted: a stream
decoding beside a prompt's chunk waits for the whole step. Two bounds, both measured as the
engine runs (a step's time without prefill, and the time per prompt token):
- One request's chunk (`chunk_cap`, `--long-prefill-ms`, on by default): a step with decodes
  takes at most `long_target` seconds of any one prompt that arrived after one of those
  streams began, so no single request holds the streams that were running before it for
  longer, whatever its prompt (issue 40: a chat request with tools and a tool-call history,
  840 tokens, held a canary stream for 335 ms in one 2,048-token step on an AMX Xeon). Many
  short prompts still share a step whole, and prompts that arrived together (a closed loop's
  long prompts) are not cut for each other's streams (the scheduler's rule: cutting them cost
  such a loop 8-15% of its tok/s); a long prompt beside earlier streams takes a few more steps
  to its first token.
  This is vLLM's long-prefill threshold, set by time rather than by tokens, so that it means the
  same on a fast CPU and a slow one.
- All prompts of a step together (`cap`, `--prefill-pace-ms`, off by default): a step with
  decodes carries at most `target` seconds of prefill (or the decodes' own time, when that is
  longer: prefill may at most double a busy step). Served in turn it cost a closed loop of 32
  streams 0.75x the tok/s (an AMD EPYC, 50 ms) and 0.93x (an AMX Xeon, 100 ms), so it is off.
A step without decodes keeps the whole budget under both, so a lone request's prompt is as
fast as before; the tokens are the same however a prompt is chunked.

What it owns: the two moving averages and the caps they give, fed by `record` after each step.
"""

from __future__ import annotations

TARGET_SECONDS = 0.05
"""Prefill time a step with decodes may carry (the decodes' own time when that is longer)."""
MIN_CHUNK = 8
"""Prefill tokens a step with decodes always may carry, so a prompt always advances. On a CPU
a few rows cost nearly as much each as a decode (measured on the default model, one thread of
a loaded 2-core VM: a decode step 45 ms, with 8 prompt tokens 210 ms, with 512 tokens 4.9 s),
so the cap often sits here: a long prompt beside streams takes more steps, and longer, than
alone (the price of the streams' smooth pace)."""
FIRST_CHUNK = MIN_CHUNK
"""The cap before anything is measured (a first prefill beside streams measures it)."""
_WEIGHT = 0.3
"""Of a new sample in the moving averages."""


MIN_LONG_CHUNK = 16
"""The fewest tokens of one prompt a step with decodes may carry under `chunk_cap`, however
slow a token, so that a long prompt still advances. It was 64, and 64 tokens are not always
cheap: deep into an 840-token prompt (a chat with tools and a tool-call history) each one
cost 1.2-1.8 ms on one thread of an AMD EPYC, attention over the context most of it, so a
chunk held a canary stream for 80-136 ms against the 50 ms asked (issue 40's 100 ms bound;
docs/notes/2026-12-07-tenth.md). The row-exact kernels cost a row about the same from 16 rows
on, so smaller chunks cost the long prompt a few more steps, not a slower kernel."""
FIRST_LONG_CHUNK = 32
"""`chunk_cap` before any prompt token is measured (a stream whose own prompt was a few tokens,
then a long prompt beside it): a prompt token costs the default model 0.25-0.5 ms near the
start of a prompt with one thread on an AMX Xeon, about 1 ms on an AMD EPYC; a first chunk of
64 tokens held a canary for 79 ms there, of 128 for 76-146 ms on the Xeon. The first chunk
measures the cost for the next ones."""
LONG_SAMPLE = 16
"""Prompt tokens a step must carry for its time to count towards `chunk_cap`'s cost of a token
(fewer: a token's cost is lost in the step's fixed cost)."""


class PrefillPace:
    def __init__(
        self,
        budget: int,
        target: float | None = TARGET_SECONDS,
        long_target: float | None = None,
    ) -> None:
        self.budget = budget
        self.target = target
        """Prefill seconds of a step with decodes, all prompts together (`cap`); None: no cap."""
        self.long_target = long_target
        """Prefill seconds of one prompt in a step with decodes (`chunk_cap`); None: no cap."""
        self.base: float | None = None
        """Seconds of a step with decodes and no prefill."""
        self.per_token: float | None = None
        """Seconds per prefill token, beyond the decodes' time (steps with decodes)."""
        self.any_token: float | None = None
        """Seconds per prefill token over every step with prompt tokens: a step of prompts
        alone counts too (its whole time, the step's fixed cost included: an estimate on the
        safe side), so a long prompt beside a stream is capped by its measured cost as soon as
        any prompt of 16 tokens or more has run."""

    def cap(self) -> int | None:
        """Prefill tokens the next step may carry beside its decodes, all prompts together;
        None: no cap (`target` None)."""
        if self.target is None:
            return None
        if self.per_token is None:
            return min(FIRST_CHUNK, self.budget)
        allowance = max(self.target, self.base or 0.0)
        return max(MIN_CHUNK, min(self.budget, int(allowance / max(self.per_token, 1e-9))))

    def chunk_cap(self) -> int | None:
        """Tokens of one prompt the next step may carry beside its decodes; None: no cap
        (`long_target` None)."""
        if self.long_target is None:
            return None
        if self.any_token is None:
            return min(FIRST_LONG_CHUNK, self.budget)
        tokens = int(self.long_target / max(self.any_token, 1e-9))
        return max(MIN_LONG_CHUNK, min(self.budget, tokens))

    def record(self, seconds: float, decodes: int, prefill_tokens: int) -> None:
        """A step ran `decodes` one-token rows and `prefill_tokens` other tokens in `seconds`."""
        if prefill_tokens >= LONG_SAMPLE:
            beside = (self.base or 0.0) if decodes else 0.0
            self.any_token = _average(self.any_token, max(seconds - beside, 0.0) / prefill_tokens)
        if not decodes:
            return  # a step of prompts alone is not capped by `cap`: its cost says nothing of it
        if prefill_tokens == 0:
            self.base = _average(self.base, seconds)
        elif prefill_tokens >= MIN_CHUNK:  # fewer: a token's cost is lost in the step's noise
            sample = max(seconds - (self.base or 0.0), 0.0) / prefill_tokens
            self.per_token = _average(self.per_token, sample)


def _average(average: float | None, sample: float) -> float:
    return sample if average is None else average + _WEIGHT * (sample - average)
