"""A `Constraint` in llguidance's terms: the grammar text it compiles to, its validation, the
vocabulary llguidance computes masks over, and one request's matcher (`Grammar`).

This file is the package's public face; one private module per concept: `_text` (grammar text,
limits, errors in a client's words), `_vocabulary` (the model's vocabulary for masks), `_check`
(validation before the engine sees a constraint) and `_matcher` (one request's state).

What it owns: every choice of how a constraint becomes a grammar (compact JSON unless a
whitespace pattern is given; objects closed to the keys a schema lists; a choice as one
lexeme; a grammar given as Lark or GBNF), the limits every matcher runs under, and the words
the client sees when the grammar engine refuses something. The frontend (to refuse a bad
constraint with a 400 before the engine sees it) and the engine (to compile it) both use this
module, so the two can never disagree about what is valid. Nothing here imports torch; the
frontend calls `check` off its event loop.

Invariants:
- llguidance's tokenization of the bytes a grammar forces is lossless. A model's vocabulary may
  lack a token for some byte values (SmolLM2's has none for 21 of them, F2 among them: the
  first byte of U+80000-U+BFFFF). The tokenizer then drops such a byte without a word, and
  llguidance, forcing the tokens of what it believes are the forced bytes, would allow a token
  the grammar refuses next. The grammar vocabulary therefore holds one placeholder token per
  missing byte, numbered past the model's logits: a grammar that forces such a byte gets a
  mask with no model token in it, which the sampler reports as a dead end.
- No message from the grammar engine carries its parser state or the grammar (`clean_error`).

llguidance was chosen over xgrammar by bench/apis/structured.py (table in
bench/results/structured.md): no dependencies, forced-token computation for jump-forward, masks
for draft tokens in one parallel call, and Lark and GBNF both accepted.

Why one package: validation, the vocabulary and the matcher must agree on every limit and every
byte; keeping them side by side, behind one import, is what guarantees the frontend and the
engine never disagree about what is valid.
"""

from trio_llm.grammar._check import check, is_checked
from trio_llm.grammar._matcher import Grammar, dead_end
from trio_llm.grammar._text import (
    ConstraintError,
    clean_error,
    closed,
    grammar_text,
    lark_expression,
    limits,
)
from trio_llm.grammar._vocabulary import GrammarVocabulary, grammar_vocabulary, unproducible_bytes

__all__ = [
    "ConstraintError",
    "Grammar",
    "GrammarVocabulary",
    "check",
    "clean_error",
    "closed",
    "dead_end",
    "grammar_text",
    "grammar_vocabulary",
    "is_checked",
    "lark_expression",
    "limits",
    "unproducible_bytes",
]
