"""Prefill pacing: how many prompt tokens a step may carry beside running streams.

Why: a CPU step's time grows with its tokens. The step budget (512 tokens on a CPU) lets one
long prompt's chunk share a step with every decoding stream, and on the default model one
thread computes about 6 ms per prompt token: a 512-token chunk held every stream for 1.3 to
4 s (a chat request with tools and a tool-call history renders to 1,700 tokens; issue 40's
stall). The pace caps the prefill tokens of a step that has decodes to what fits in
`TARGET_SECONDS` (or in the decodes' own time, when that is longer: prefill may at most double
a busy step), measured as the engine runs. A step without decodes keeps the whole budget, so
a lone request's prompt is as fast as before; the tokens are the same however a prompt is
chunked.

What it owns: two moving averages (a step's time without prefill, and the time per prefill
token) and the cap they give (`cap`), fed by `record` after each step.
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


class PrefillPace:
    def __init__(self, budget: int, target: float = TARGET_SECONDS) -> None:
        self.budget = budget
        self.target = target
        self.base: float | None = None
        """Seconds of a step with decodes and no prefill."""
        self.per_token: float | None = None
        """Seconds per prefill token, beyond the decodes' time."""

    def cap(self) -> int:
        """Prefill tokens the next step may carry beside its decodes."""
        if self.per_token is None:
            return min(FIRST_CHUNK, self.budget)
        allowance = max(self.target, self.base or 0.0)
        return max(MIN_CHUNK, min(self.budget, int(allowance / max(self.per_token, 1e-9))))

    def record(self, seconds: float, decodes: int, prefill_tokens: int) -> None:
        """A step ran `decodes` one-token rows and `prefill_tokens` other tokens in `seconds`."""
        if not decodes:
            return  # a step of prompts alone is not capped: its cost says nothing of the cap's
        if prefill_tokens == 0:
            self.base = _average(self.base, seconds)
        elif prefill_tokens >= MIN_CHUNK:  # fewer: a token's cost is lost in the step's noise
            sample = max(seconds - (self.base or 0.0), 0.0) / prefill_tokens
            self.per_token = _average(self.per_token, sample)


def _average(average: float | None, sample: float) -> float:
    return sample if average is None else average + _WEIGHT * (sample - average)
