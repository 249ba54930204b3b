"""A thinking budget in the engine: count a request's tokens inside its think block and, once
the budget is spent with the block still open, force the block's closing tag.

Why here and not in the grammar: llguidance ends a lexeme after `max_tokens` tokens, but the
only way to then force the tag (a `stop` lexeme followed by the tag) panics when the model
closes the block by itself, and such a grammar cannot roll back for jump-forward drafts. So the
grammar keeps the thinking free up to its tag (a `suffix` lexeme: grammar.py), and this
counter takes the committed tokens' bytes, notices the tag, and when the budget runs out first
names the tokens that finish it (the rest of a tag the model had begun, or the whole tag); the
step's mask then allows only the next of them (engine/step/structured.py).

Invariant: it forces only while the block is open (the tag not yet seen in the output's bytes),
so it never writes into the answer; what it forces is text the grammar allows there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from trio_llm.constraint import Thinking


def _held(tail: bytes, tag: bytes) -> int:
    """The length of the longest end of `tail` that is a proper prefix of `tag`."""
    for size in range(min(len(tail), len(tag) - 1), 0, -1):
        if tag.startswith(tail[-size:]):
            return size
    return 0


@dataclass(slots=True)
class ThinkingBudget:
    close: bytes
    budget: int
    """Tokens the block may take (its tags' among them) before the tag is forced."""
    token_bytes: Callable[[int], bytes]
    tokenize: Callable[[bytes], list[int]]
    used: int = 0
    tail: bytes = b""
    """The output's last bytes, as many as may hold the start of the tag."""
    closed: bool = False
    forcing: list[int] = field(default_factory=list)
    """The tokens that finish the tag, once the budget is spent; the first is next."""

    @classmethod
    def of(
        cls,
        thinking: Thinking,
        token_bytes: Callable[[int], bytes],
        tokenize: Callable[[bytes], list[int]],
    ) -> ThinkingBudget | None:
        if thinking.budget is None:
            return None
        return cls(thinking.close.encode(), thinking.budget, token_bytes, tokenize)

    def advance(self, tokens: list[int]) -> None:
        """Count the tokens the request committed."""
        for token in tokens:
            if self.closed:
                return
            if self.forcing:
                self.forcing.pop(0)
            self.used += 1
            window = self.tail + self.token_bytes(token)
            if self.close in window:
                self.closed = True
                self.forcing.clear()
                return
            self.tail = window[len(window) - _held(window, self.close) :]
            if self.used >= self.budget and not self.forcing:
                self.forcing = self.tokenize(self.close[len(self.tail) :])

    def next_token(self) -> int | None:
        """The token the next step must write, while the tag is being forced."""
        return self.forcing[0] if self.forcing and not self.closed else None
