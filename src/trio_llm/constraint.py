"""A structured-output constraint: what a request's output must match, as a typed spec.

It travels inside `SamplingParams` (and so inside `EngineCoreRequest`) as its kind and its text,
never as a compiled object: the engine compiles it, in a worker thread of its own process
(`trio_llm.engine.step.structured`). The frontend builds one from whichever field a caller used
(`response_format`, vLLM's `structured_outputs`, the legacy `guided_*`), validates it with the
grammar library before anything reaches the engine (`trio_llm.grammar.check`), and the
library user builds one with the constructors below.

JSON is compact by default (no whitespace between tokens): a JSON grammar that lets a small
model put whitespace anywhere lets it wander through spaces and newlines until max_tokens.
`whitespace_pattern` (a regex) allows whitespace where JSON does, matching that pattern.

A reasoning model thinks before it answers: with `thinking`, the output is a think block, free
text up to its closing tag (at most `Thinking.budget` tokens of it, after which the closing tag
is forced), and only what follows must match the spec. So a schema never lands in the
reasoning, and asking for one never turns the thinking off.
"""

from __future__ import annotations

import enum
import functools
import json
import re
from typing import Any

import msgspec

MAX_SCHEMA_DEPTH = 64
"""The deepest nesting of objects and arrays a JSON schema may have. The grammar engine reads a
grammar with serde_json, which stops at 128 levels; a schema's own levels and the grammar's
wrapping stay well inside that here, and no schema people write comes close."""


class ConstraintKind(enum.IntEnum):
    JSON_SCHEMA = 0
    """`spec` is a JSON schema, as JSON text."""
    JSON_OBJECT = 1
    """Any JSON object; `spec` is empty."""
    REGEX = 2
    """`spec` is a regular expression the whole output matches (Rust `regex` syntax)."""
    CHOICE = 3
    """`spec` is a JSON array of strings; the output is exactly one of them."""
    GRAMMAR = 4
    """`spec` is a context-free grammar: Lark (llguidance's syntax) or llama.cpp's GBNF."""


class Thinking(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    """The think block a constrained answer comes after (`<think>...</think>`)."""

    open: str = "<think>"
    close: str = "</think>"
    inside: bool = False
    """The prompt opened the block itself (DeepSeek-R1's template): the output starts inside
    it. False: the output opens it first."""
    budget: int | None = None
    """At most this many tokens inside the block (its tags among them); then the engine forces
    the closing tag (thinking_budget.py). None: no limit."""
    header: str = ""
    """What the answer may start with after the block (Harmony's final-channel header), which
    the constraint on the answer does not cover; empty: nothing."""


ANY_TEXT = "start: /(.|\\n)*/"
"""The grammar of an unconstrained answer: what a thinking budget alone constrains after."""


class Constraint(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    kind: ConstraintKind
    spec: str = ""
    whitespace_pattern: str | None = None
    """JSON kinds: the whitespace allowed between tokens, as a regex; None: none at all."""
    thinking: Thinking | None = None
    """The think block before the answer the spec constrains; None: the spec starts at once."""

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def json_schema(
        cls, schema: dict[str, Any] | str, *, whitespace_pattern: str | None = None
    ) -> Constraint:
        text = schema if isinstance(schema, str) else schema_text(schema)
        return cls(ConstraintKind.JSON_SCHEMA, text, whitespace_pattern)

    @classmethod
    def json_object(cls, *, whitespace_pattern: str | None = None) -> Constraint:
        return cls(ConstraintKind.JSON_OBJECT, "", whitespace_pattern)

    @classmethod
    def regex(cls, pattern: str) -> Constraint:
        return cls(ConstraintKind.REGEX, pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> Constraint:
        return cls(ConstraintKind.CHOICE, json.dumps(list(choices)))

    @classmethod
    def grammar(cls, grammar: str) -> Constraint:
        return cls(ConstraintKind.GRAMMAR, grammar)

    @classmethod
    def any_text(cls) -> Constraint:
        """No constraint on the answer: with `after_thinking`, only the thinking's budget."""
        return cls(ConstraintKind.GRAMMAR, ANY_TEXT)

    def after_thinking(self, thinking: Thinking | None) -> Constraint:
        """This constraint on the answer that follows `thinking` (None: from the start)."""
        return msgspec.structs.replace(self, thinking=thinking)

    # -- checks that need no grammar library ----------------------------------------------

    def validate(self) -> None:
        """Raise `ValueError` for a spec that cannot be one of its kind (the grammar library
        checks the rest: `trio_llm.grammar.check`). The spec's checks are remembered: a
        request's constraint is validated at each layer it crosses, and a large schema takes
        milliseconds to read."""
        thinking = self.thinking
        if thinking is not None:
            if not thinking.close or (not thinking.inside and not thinking.open):
                raise ValueError("the think block's tags must not be empty")
            if thinking.budget is not None and thinking.budget < 1:
                raise ValueError("a thinking budget must be at least 1 token")
        error = _spec_error(self.kind, self.spec)
        if error:
            raise ValueError(error)

    @property
    def choices(self) -> list[str]:
        """A CHOICE constraint's strings."""
        try:
            choices = json.loads(self.spec)
        except ValueError:
            return []
        return choices if isinstance(choices, list) else []


@functools.lru_cache(maxsize=256)
def _spec_error(kind: ConstraintKind, spec: str) -> str:
    """What is wrong with `spec` as a constraint of `kind` ('' when nothing is)."""
    if kind is ConstraintKind.JSON_OBJECT:
        return ""
    if not spec:
        return f"the {kind.name.lower()} constraint is empty"
    if kind is ConstraintKind.JSON_SCHEMA:
        depth = json_depth(spec)
        if depth > MAX_SCHEMA_DEPTH:
            return _too_deep(depth)
        try:
            schema = json.loads(spec)
        except ValueError as exc:
            return f"the JSON schema is not valid JSON: {exc}"
        if not isinstance(schema, dict | bool):
            return "a JSON schema must be an object (or true/false)"
        return schema_bound_error(schema)
    elif kind is ConstraintKind.CHOICE:
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if not choices or not isinstance(choices, list):
            return "choice must be a non-empty list of non-empty strings"
        if not all(isinstance(c, str) and c for c in choices):
            return "choice must be a non-empty list of non-empty strings"
    return ""


_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_BOUND_LIMIT = 2**63
"""llguidance reads a numeric bound as a 64-bit integer, saturating: an integer range whose
bounds both saturate at -2**63 sends its regex builder into unbounded recursion, which
overflows the thread's stack and kills the process (the frontend's, when it validates). So no
bound may reach that range, on either side."""


def schema_bound_error(schema: Any) -> str:
    """The first numeric bound of `schema` (at any depth: check its depth first, as
    `validate` does) outside the grammar engine's range ('' if none). Tool schemas, which
    reach the grammar engine inside a tool grammar, take the same check."""
    if isinstance(schema, list):
        return next((e for e in map(schema_bound_error, schema) if e), "")
    if not isinstance(schema, dict):
        return ""
    for keyword in _BOUNDS:
        value = schema.get(keyword)
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if number and not -_BOUND_LIMIT < value < _BOUND_LIMIT:  # exact for ints of any size
            text = str(value) if len(str(value)) <= 24 else str(value)[:21] + "..."
            return (
                f"the JSON schema's {keyword} {text} is outside the range the grammar "
                "engine reads bounds in (64-bit integers: -2**63 < bound < 2**63)"
            )
    return next((e for e in map(schema_bound_error, schema.values()) if e), "")


_JSON_TOKENS = re.compile(r'\\.|["\[\]{}]')
"""What decides JSON's nesting: brackets, quotes, and escapes (a backslash and what it escapes)."""


def json_depth(text: str) -> int:
    """The deepest nesting of objects and arrays in JSON `text` (brackets inside strings not
    counted), found without parsing it: a document thousands of levels deep must not reach a
    recursive parser. Only the tokens that matter are visited (the regex skips the rest)."""
    depth = deepest = 0
    in_string = False
    for match in _JSON_TOKENS.finditer(text):
        token = match.group()
        if token == '"':
            in_string = not in_string
        elif in_string:
            continue
        elif token in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif token in "]}":
            depth -= 1
    return deepest


def schema_text(schema: Any) -> str:
    """`schema` as JSON text; `ValueError` for one nested too deeply to encode at all (the
    depth of the rest is `validate`'s to refuse)."""
    try:
        return msgspec.json.encode(schema).decode()
    except RecursionError:
        raise ValueError(_too_deep(f"more than {MAX_SCHEMA_DEPTH}")) from None
    except (TypeError, msgspec.EncodeError) as exc:
        raise ValueError(f"the JSON schema cannot be encoded: {exc}") from None


def schema_depth(schema: Any) -> int:
    """How deeply `schema` (a decoded JSON value) nests, read off its encoding (C speed)."""
    try:
        return json_depth(msgspec.json.encode(schema).decode())
    except RecursionError:
        return 1 << 20


def _too_deep(depth: int | str) -> str:
    return f"the JSON schema is nested {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are allowed"
