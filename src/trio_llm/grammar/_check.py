"""Whether llguidance can enforce a constraint for a model, checked before the engine sees it.

What it owns: `check` (the grammar validated under the engine's own limits, then walked a few
bytes in over a vocabulary of single bytes, skipping the bytes the model cannot produce) and
its memory of recent answers (`is_checked`: whether the frontend may answer on its event loop).

Invariant: a constraint `check` accepts compiles in the engine under the same `limits()`, so the
frontend refuses with a 400 what the engine would fail on.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict

import llguidance
import numpy as np
from llguidance import LLMatcher

from trio_llm.constraint import Constraint
from trio_llm.grammar._matcher import dead_end
from trio_llm.grammar._text import ConstraintError, clean_error, grammar_text, limits

PROBE_BYTES = 64
"""Bytes a check walks into a constraint (`probe`)."""

_CHECK_CACHE = 256
_checked: OrderedDict[tuple[frozenset[int], Constraint], str] = OrderedDict()
"""Constraints validated lately (with the bytes the model could not produce) -> their error
('' when valid), least recently used first."""
_checked_lock = threading.Lock()


def check(constraint: Constraint, unproducible: frozenset[int] = frozenset()) -> None:
    """Raise `ConstraintError` unless llguidance can enforce `constraint` (a bad regex, an
    unknown JSON-schema keyword or format, a grammar that does not parse or is too deep, one
    past the grammar engine's limits...) for a model whose vocabulary cannot produce the bytes
    `unproducible`: the grammar is also walked a few bytes in (`probe`). Remembered: clients
    send the same few constraints again and again, and a large schema takes a while."""
    key = (unproducible, constraint)
    with _checked_lock:
        error = _checked.get(key)
        if error is not None:
            _checked.move_to_end(key)
    if error is None:
        try:
            text = grammar_text(constraint)
            error = clean_error(LLMatcher.validate_grammar(text, limits=limits()))
            if not error:
                probe(text, unproducible)
        except ConstraintError as exc:
            error = str(exc)
        with _checked_lock:
            _checked[key] = error
            while len(_checked) > _CHECK_CACHE:
                _checked.popitem(last=False)
    if error:
        raise ConstraintError(error)


def is_checked(constraint: Constraint, unproducible: frozenset[int] = frozenset()) -> bool:
    """Whether `check` answers from memory (no need to leave the event loop for it)."""
    with _checked_lock:
        return (unproducible, constraint) in _checked


@functools.cache
def _byte_tokenizer() -> llguidance.LLTokenizer:
    """llguidance's vocabulary of the 256 bytes, one token each (instant to build)."""
    return llguidance.LLTokenizer("byte")


def probe(text: str, unproducible: frozenset[int]) -> None:
    """Compile grammar `text` over a vocabulary of single bytes and walk it `PROBE_BYTES` bytes
    in, each step the lowest byte it allows that the model can produce: raise
    `ConstraintError` where it fails (the grammar engine's per-step limits are met at the
    first bytes: a choice of thousands of alternatives opens them all there) or where it
    allows nothing the model can produce (a character whose bytes its vocabulary lacks)."""
    tokenizer = _byte_tokenizer()
    matcher = LLMatcher(tokenizer, text, log_level=0, limits=limits())
    for _ in range(PROBE_BYTES):
        if matcher.is_error() or matcher.is_stopped():
            break
        mask = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        allowed = np.flatnonzero(np.unpackbits(mask, bitorder="little")[:256])
        if matcher.is_error():
            break
        byte = next((int(b) for b in allowed if int(b) not in unproducible), None)
        if byte is None:
            if matcher.is_accepting():
                return  # it may only end
            raise ConstraintError(dead_end(matcher, unproducible))
        matcher.consume_token(byte)
    if matcher.is_error():
        raise ConstraintError(clean_error(matcher.get_error()))
