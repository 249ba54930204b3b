"""A `Constraint` in llguidance's terms: the grammar text it compiles to, its validation, the
tokenizer llguidance computes masks over, and one request's matcher (`Grammar`).

What it owns: every choice of how a constraint becomes a grammar (compact JSON unless a
whitespace pattern is given; a choice as a Lark alternation; a grammar given as Lark or GBNF),
in one place that the frontend (to refuse a bad constraint with a 400 before the engine sees
it) and the engine (to compile it) both use, so the two can never disagree about what is valid.
Nothing here imports torch; the frontend calls `check` off its event loop for large specs.

llguidance was chosen over xgrammar by bench/structured.py (table in
bench/results/structured.md): no dependencies, forced-token computation for jump-forward, masks
for draft tokens in one parallel call, and Lark and GBNF both accepted.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from copy import copy
from typing import TYPE_CHECKING, Any

import llguidance
from llguidance import LLMatcher

from trio_llm.constraint import Constraint, ConstraintKind

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False}
"""llguidance's JSON options by default: no whitespace anywhere, the separators "," and ":"."""


class ConstraintError(ValueError):
    """A constraint the grammar engine cannot enforce; the message says why."""


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar (its JSON form) for `constraint`. Raises `ConstraintError` for a
    spec that is not even well-formed; `check` validates the rest."""
    try:
        constraint.validate()
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None
    kind = constraint.kind
    if kind is ConstraintKind.JSON_SCHEMA or kind is ConstraintKind.JSON_OBJECT:
        options = dict(COMPACT_JSON)
        if constraint.whitespace_pattern is not None:
            options = {"whitespace_pattern": constraint.whitespace_pattern}
        schema = constraint.spec if kind is ConstraintKind.JSON_SCHEMA else '{"type": "object"}'
        # Defaults, not overrides: a schema's own "x-guidance" options win.
        return LLMatcher.grammar_from_json_schema(schema, defaults=options)  # type: ignore[arg-type]
    if kind is ConstraintKind.REGEX:
        return LLMatcher.grammar_from_regex(constraint.spec)
    if kind is ConstraintKind.CHOICE:
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choices)
        return LLMatcher.grammar_from_lark(f"start: {alternatives}")
    try:
        # Lark, or GBNF converted to Lark.
        return llguidance.grammar_from("grammar", constraint.spec)
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None


_CHECK_CACHE = 256
_checked: OrderedDict[Constraint, str] = OrderedDict()
"""Constraints validated lately -> their error ('' when valid), least recently used first."""
_checked_lock = threading.Lock()


def check(constraint: Constraint) -> None:
    """Raise `ConstraintError` unless llguidance can enforce `constraint` (a bad regex, an
    unknown JSON-schema keyword or format, a grammar that does not parse...). Remembered:
    clients send the same few constraints again and again, and a large schema takes a while."""
    with _checked_lock:
        error = _checked.get(constraint)
        if error is not None:
            _checked.move_to_end(constraint)
    if error is None:
        try:
            error = _first_lines(LLMatcher.validate_grammar(grammar_text(constraint)))
        except ConstraintError as exc:
            error = str(exc)
        with _checked_lock:
            _checked[constraint] = error
            while len(_checked) > _CHECK_CACHE:
                _checked.popitem(last=False)
    if error:
        raise ConstraintError(error)


def is_checked(constraint: Constraint) -> bool:
    """Whether `check` answers from memory (no need to leave the event loop for it)."""
    with _checked_lock:
        return constraint in _checked


def _first_lines(message: str, limit: int = 600) -> str:
    """llguidance's error without its parser-state dump, short enough for an error response."""
    message = message.split("\n<state>", 1)[0].strip()
    return message if len(message) <= limit else message[: limit - 3] + "..."


def llg_tokenizer(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: list[int]
) -> llguidance.LLTokenizer:
    """llguidance's view of the model's vocabulary (about a second to build: do it once).

    The mask covers `vocab_size` (the model's logits, which may be wider than the tokenizer),
    and a grammar that has ended allows every one of the engine's EOS tokens."""
    backend = copy(tokenizer.backend_tokenizer)  # type: ignore[attr-defined]
    backend.no_padding()
    backend.no_truncation()
    return llguidance.LLTokenizer(
        backend.to_str(), n_vocab=vocab_size, eos_token=sorted(eos_token_ids)
    )


class Grammar:
    """One request's matcher: the state of its grammar after its committed tokens."""

    __slots__ = ("matcher",)

    def __init__(self, matcher: LLMatcher) -> None:
        self.matcher = matcher

    def accept(self, tokens: list[int]) -> bool:
        """Advance by the tokens the request committed; False (and `error` set) if the grammar
        does not allow them."""
        return self.matcher.consume_tokens(tokens)

    def is_terminated(self) -> bool:
        """The grammar admits no more tokens (EOS aside): the output is complete."""
        return self.matcher.is_stopped()

    @property
    def error(self) -> str:
        return self.matcher.get_error()

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next (none where the model has a choice)."""
        return self.matcher.compute_ff_tokens()
