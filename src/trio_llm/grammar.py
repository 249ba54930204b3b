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

from trio_llm.constraint import Constraint, ConstraintKind, Thinking
from trio_llm.thinking_budget import ThinkingBudget

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False}
"""llguidance's JSON options by default: no whitespace anywhere, the separators "," and ":"."""


class ConstraintError(ValueError):
    """A constraint the grammar engine cannot enforce; the message says why."""


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
    and a grammar that has ended allows every one of the engine's EOS tokens. Added tokens that
    are not special are text (`_added_tokens_as_text`)."""
    backend = copy(tokenizer.backend_tokenizer)  # type: ignore[attr-defined]
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    _added_tokens_as_text(spec)
    return llguidance.LLTokenizer(
        json.dumps(spec), n_vocab=vocab_size, eos_token=sorted(eos_token_ids)
    )


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


def _byte_level_alphabet() -> list[str]:
    """GPT-2's byte-level alphabet: the character that stands for each byte in a token's text
    (printable Latin-1 bytes stand for themselves, the others are shifted past U+00FF)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in chars)
    for i, b in enumerate(shifted):
        chars[b] = chr(0x100 + i)
    return [chars[b] for b in range(256)]


class Grammar:
    """One request's matcher: the state of its grammar after its committed tokens (and of its
    thinking budget, when it has one)."""

    __slots__ = ("budget", "matcher")

    def __init__(self, matcher: LLMatcher, budget: ThinkingBudget | None = None) -> None:
        self.matcher = matcher
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
        return self.matcher.get_error()

    def forced_tokens(self) -> list[int]:
        """The tokens the grammar forces next (none where the model has a choice, nor while
        the thinking budget forces its tag: one token a step then)."""
        if self.forced_token() is not None:
            return []
        return self.matcher.compute_ff_tokens()
