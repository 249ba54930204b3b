"""One request's grammar state (`Grammar`), and why a grammar allows no token, in a client's
words (`dead_end`).

What it owns: what the engine asks of a request's matcher each step (accept the committed
tokens, the forced tokens for jump-forward, the token a thinking budget forces, whether the
output is complete), kept short of the placeholders of bytes the model cannot produce.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from llguidance import LLMatcher

from trio_llm.grammar._text import clean_error
from trio_llm.grammar._vocabulary import GrammarVocabulary
from trio_llm.thinking_budget import ThinkingBudget


def dead_end(matcher: LLMatcher, unproducible: frozenset[int], others: Sequence[str] = ()) -> str:
    """Why `matcher` allows no token of the model, in words for a client; `unproducible`: the
    bytes no token of the model produces; `others`: the request's other restrictions in force
    (allowed_token_ids, bad_words...)."""
    if matcher.is_error():
        return "the constraint failed: " + clean_error(matcher.get_error())
    forced = matcher.compute_ff_bytes()
    missing = sorted({b for b in forced if b in unproducible})
    if missing:
        return (
            f"the constraint requires the bytes {_hex(forced[:16])} next, and no token of "
            f"this model's vocabulary produces the byte {_hex(missing)}"
        )
    if others:
        return f"the constraint allows no token here that {' and '.join(others)} also allow"
    return "the constraint allows no token of this model's vocabulary here"


def _hex(data: Iterable[int]) -> str:
    return " ".join(f"{b:02X}" for b in data)


class Grammar:
    """One request's matcher: the state of its grammar after its committed tokens (and of its
    thinking budget, when it has one)."""

    __slots__ = ("budget", "matcher", "vocabulary")

    def __init__(
        self,
        matcher: LLMatcher,
        vocabulary: GrammarVocabulary,
        budget: ThinkingBudget | None = None,
    ) -> None:
        self.matcher = matcher
        self.vocabulary = vocabulary
        self.budget = budget

    def accept(self, tokens: list[int]) -> bool:
        """Advance by the tokens the request committed; False (and `error` set) if the grammar
        does not allow them."""
        if not self.matcher.consume_tokens(tokens):
            return False
        if self.budget is not None:
            self.budget.advance(tokens)
        return True

    def forced_token(self) -> int | None:
        """The one token the next step may write (the thinking budget's closing tag); None:
        the grammar's mask decides."""
        return None if self.budget is None else self.budget.next_token()

    def is_terminated(self) -> bool:
        """The grammar admits no more tokens (EOS aside): the output is complete."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        """Why the matcher failed, in words for a client."""
        return clean_error(self.matcher.get_error())

    def dead_end(self, others: list[str]) -> str:
        """Why the grammar allows no token of the model now (`others`: the request's other
        restrictions in force), in words for a client."""
        return dead_end(self.matcher, self.vocabulary.unproducible, others)

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next (none where the model has a choice, nor while
        the thinking budget forces its tag: one token a step then), up to the first
        placeholder of a byte the model cannot produce."""
        if self.forced_token() is not None:
            return []
        forced = self.matcher.compute_ff_tokens()
        limit = self.vocabulary.vocab_size
        for i, token in enumerate(forced):
            if token >= limit:
                return forced[:i]
        return forced
