"""A `Constraint` in llguidance's terms: the grammar text it compiles to, its validation, the
vocabulary llguidance computes masks over, and one request's matcher (`Grammar`).

What it owns: every choice of how a constraint becomes a grammar (compact JSON unless a
whitespace pattern is given; a choice as one lexeme; a grammar given as Lark or GBNF), the
limits every matcher runs under, and the words the client sees when the grammar engine refuses
something. The frontend (to refuse a bad constraint with a 400 before the engine sees it) and
the engine (to compile it) both use this module, so the two can never disagree about what is
valid. Nothing here imports torch; the frontend calls `check` off its event loop.

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

Why over 400 lines: validation, the vocabulary and the matcher must agree on every limit and
every byte; keeping them in one module is what guarantees the frontend and the engine never
disagree about what is valid.
"""

from __future__ import annotations

import functools
import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from copy import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance import LLMatcher, LLParserLimits

from trio_llm.constraint import Constraint, ConstraintKind, Thinking
from trio_llm.thinking_budget import ThinkingBudget

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False}
"""llguidance's JSON options by default: no whitespace anywhere, the separators "," and ":"."""

PROBE_BYTES = 64
"""Bytes a check walks into a constraint (`probe`)."""


def limits() -> LLParserLimits:
    """The limits every matcher runs under: llguidance's own, without the parser state and
    grammar that its verbose errors append (they must not reach a client)."""
    return LLParserLimits(verbose_errors=False)


class ConstraintError(ValueError):
    """A constraint the grammar engine cannot enforce; the message says why."""


# ---------------------------------------------------------------------------------------------
# Grammar text


def grammar_text(constraint: Constraint) -> str:
    """The llguidance grammar (its JSON form, or Lark) for `constraint`. Raises
    `ConstraintError` for a spec that is not even well-formed; `check` validates the rest."""
    try:
        constraint.validate()
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None
    answer = _answer_text(constraint)
    if constraint.thinking is None:
        return answer
    return _after_thinking(answer, constraint.thinking)


def _answer_text(constraint: Constraint) -> str:
    kind = constraint.kind
    if kind is ConstraintKind.JSON_SCHEMA or kind is ConstraintKind.JSON_OBJECT:
        options = dict(COMPACT_JSON)
        if constraint.whitespace_pattern is not None:
            options = {"whitespace_pattern": constraint.whitespace_pattern}
        schema = constraint.spec if kind is ConstraintKind.JSON_SCHEMA else '{"type": "object"}'
        try:
            # Defaults, not overrides: a schema's own "x-guidance" options win.
            return LLMatcher.grammar_from_json_schema(schema, defaults=options)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConstraintError(clean_error(str(exc))) from None
    if kind is ConstraintKind.REGEX:
        return LLMatcher.grammar_from_regex(constraint.spec)
    if kind is ConstraintKind.CHOICE:
        # One lexeme (an upper-case Lark rule): the lexer's automaton holds the alternatives,
        # however many, where parser rules would open one Earley item per alternative and
        # meet llguidance's limit of 2000 items in a row.
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choices)
        return LLMatcher.grammar_from_lark(f"start: CHOICE\nCHOICE: {alternatives}")
    try:
        # Lark, or GBNF converted to Lark.
        return llguidance.grammar_from("grammar", constraint.spec)
    except ValueError as exc:
        raise ConstraintError(clean_error(str(exc))) from None


def lark_expression(constraint: Constraint) -> str:
    """`constraint` as the right-hand side of a Lark rule, for a grammar that offers it beside
    something else (tool calls). A grammar constraint cannot be one: it has rules of its own."""
    try:
        constraint.validate()
    except ValueError as exc:
        raise ConstraintError(str(exc)) from None
    kind = constraint.kind
    if kind is ConstraintKind.JSON_SCHEMA or kind is ConstraintKind.JSON_OBJECT:
        schema = json.loads(constraint.spec) if kind is ConstraintKind.JSON_SCHEMA else {}
        if schema is True:
            schema = {}
        if schema is False:
            raise ConstraintError("the JSON schema false admits nothing")
        if kind is ConstraintKind.JSON_OBJECT:
            schema = {"type": "object"}
        options = dict(COMPACT_JSON)
        if constraint.whitespace_pattern is not None:
            options = {"whitespace_pattern": constraint.whitespace_pattern}
        schema["x-guidance"] = {**options, **(schema.get("x-guidance") or {})}
        return "%json " + json.dumps(schema, ensure_ascii=False)
    if kind is ConstraintKind.REGEX:
        return "/" + _escape_slashes(constraint.spec) + "/"
    if kind is ConstraintKind.CHOICE:
        return " | ".join(json.dumps(c, ensure_ascii=False) for c in constraint.choices)
    raise ConstraintError("a grammar cannot be offered beside tool calls")


def _escape_slashes(regex: str) -> str:
    """`regex` with every `/` not yet escaped by a backslash escaped: a Lark regex literal."""
    out: list[str] = []
    escaped = False
    for char in regex:
        if char == "/" and not escaped:
            out.append("\\")
        out.append(char)
        escaped = char == "\\" and not escaped
    return "".join(out)


_ROW_LIMIT = re.compile(r"Current row has (\d+) items; max is (\d+)")


def clean_error(message: str) -> str:
    """llguidance's error in words for a client: without its parser state or grammar, without
    its internal prefixes, short."""
    message = message.split("\n<state>", 1)[0].split("\n<non-verbose/>", 1)[0].strip()
    rows = _ROW_LIMIT.search(message)
    if rows is not None:
        return (
            f"the constraint is too complex for the grammar engine: {rows[1]} alternatives are "
            f"open at one point, and at most {rows[2]} may be"
        )
    message = message.removeprefix("Parser Error: ").removeprefix("parser error: ")
    return message if len(message) <= 600 else message[:597] + "..."


# ---------------------------------------------------------------------------------------------
# The vocabulary


@dataclass(frozen=True, eq=False)
class GrammarVocabulary:
    """llguidance's view of a model's vocabulary (about a second to build: do it once)."""

    tokenizer: llguidance.LLTokenizer
    vocab_size: int
    """The model's: the width of its logits. Tokens from here on are placeholders."""
    unproducible: frozenset[int]
    """The byte values UTF-8 may hold that no token of the model produces (each has a
    placeholder token)."""

    @property
    def mask_words(self) -> int:
        """The int32 words of one bitmask row (placeholders included)."""
        return (self.tokenizer.vocab_size + 31) // 32


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


def grammar_vocabulary(
    tokenizer: PreTrainedTokenizerBase, vocab_size: int, eos_token_ids: list[int]
) -> GrammarVocabulary:
    """The grammar vocabulary of a model: its tokenizer's tokens, masks as wide as its logits
    (`vocab_size`, which may exceed the tokenizer's), every one of its EOS tokens allowed where
    a grammar may end, and a placeholder past `vocab_size` for each byte no token produces."""
    backend = copy(tokenizer.backend_tokenizer)  # type: ignore[attr-defined]
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    _added_tokens_as_text(spec)
    vocab = (spec.get("model") or {}).get("vocab")
    missing = []
    if isinstance(vocab, dict) and _is_byte_level(spec.get("decoder")):
        missing = _missing_bytes(vocab)
        alphabet = _byte_level_alphabet()
        for i, b in enumerate(missing):
            vocab[alphabet[b]] = vocab_size + i
    llg = llguidance.LLTokenizer(
        json.dumps(spec), n_vocab=vocab_size + len(missing), eos_token=sorted(eos_token_ids)
    )
    return GrammarVocabulary(llg, vocab_size, frozenset(missing))


def unproducible_bytes(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """The bytes UTF-8 may hold that no token of `tokenizer` produces (the frontend's check
    refuses a constraint that forces one; `grammar_vocabulary` gives each a placeholder)."""
    backend = tokenizer.backend_tokenizer  # type: ignore[attr-defined]
    if not _is_byte_level(json.loads(backend.decoder.__getstate__()) if backend.decoder else None):
        return frozenset()
    return frozenset(_missing_bytes(backend.get_vocab(with_added_tokens=False)))


def _is_byte_level(decoder: Any) -> bool:
    """Whether a tokenizer.json `decoder` maps GPT-2's byte-level alphabet back to bytes."""
    return "ByteLevel" in json.dumps(decoder)


def _missing_bytes(vocab: Mapping[str, int]) -> list[int]:
    """The bytes UTF-8 may hold that have no token of their own in a byte-level `vocab`.
    (Vocabularies with byte fallback hold every byte as `<0xNN>`; grammars match UTF-8 text,
    and llguidance reserves 0xFF.)"""
    alphabet = _byte_level_alphabet()
    return [b for b in _UTF8_BYTES if alphabet[b] not in vocab]


_UTF8_BYTES = [b for b in range(256) if b not in (0xC0, 0xC1) and b < 0xF5]


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token's text
    (printable Latin-1 bytes stand for themselves, the others are shifted past U+00FF)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    for i, b in enumerate(shifted):
        chars[b] = chr(0x100 + i)
    return [chars[b] for b in range(256)]


# ---------------------------------------------------------------------------------------------
# Checks


_THINK_GAP = "/[ \\t\\r\\n]{0,4}/"
"""What may separate the closing tag from the answer (Qwen3 writes a blank line); bounded, so a
small model cannot wander through whitespace there."""


def _after_thinking(answer: str, thinking: Thinking) -> str:
    """`answer` (a grammar's JSON or Lark text) after a think block. The block is required (a
    model that thinks writes one, if only an empty one; one that does not gets no `thinking`),
    and its text is free up to its closing tag: a lexeme with the tag as its `suffix`, lazy, so
    the first tag ends it, and one llguidance can roll back (jump-forward's drafts). The
    answer is the second grammar of the list, `@answer`. A budget is not the grammar's: the
    engine counts the block's tokens and forces the tag (thinking_budget.py)."""
    if answer.lstrip().startswith("{"):
        inner = json.loads(answer)["grammars"]
    else:
        inner = [{"lark_grammar": answer}]
    if len(inner) != 1:
        raise ConstraintError("a grammar of several grammars cannot follow a think block")
    inner[0]["name"] = "answer"
    close = json.dumps(thinking.close, ensure_ascii=False)
    opening = "" if thinking.inside else json.dumps(thinking.open, ensure_ascii=False) + " "
    lark = [
        "%llguidance {}",
        f"start: {opening}thought GAP @answer",
        f"thought[suffix={close}]: /(.|\\n)*/",
        f"GAP: {_THINK_GAP}",
    ]
    return json.dumps({"grammars": [{"lark_grammar": "\n".join(lark)}, *inner]})


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


def _added_tokens_as_text(spec: dict[str, Any]) -> None:
    """Move the added tokens of tokenizer.json `spec` that are not special (Qwen3's `<think>`
    and `</think>`, DeepSeek-R1's) into its vocabulary, spelled in the byte-level alphabet.
    llguidance takes every added token for a special one, which no text of a grammar matches:
    a grammar that writes `</think>` could then never be satisfied by the token a model closes
    its thinking with. (llguidance then tokenizes such a tag as the text it is, which only
    matters for the tokens it proposes as forced.) Byte-level vocabularies only."""
    vocab = (spec.get("model") or {}).get("vocab")
    added = spec.get("added_tokens") or []
    if not isinstance(vocab, dict) or "ByteLevel" not in json.dumps(spec.get("decoder")):
        return
    alphabet = _byte_level_alphabet()
    kept = []
    for token in added:
        spelled = "".join(alphabet[b] for b in token["content"].encode())
        if token.get("special") or spelled in vocab:  # a vocabulary entry of its own already
            kept.append(token)
        else:
            vocab[spelled] = token["id"]
    spec["added_tokens"] = kept


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
