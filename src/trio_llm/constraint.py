"""A structured-output constraint: what a request's output must match, as a typed spec.

It travels inside `SamplingParams` (and so inside `EngineCoreRequest`) as its kind and its text,
never as a compiled object: the engine compiles it, in a worker thread of its own process
(`trio_llm.engine.structured`). The frontend builds one from whichever field a caller used
(`response_format`, vLLM's `structured_outputs`, the legacy `guided_*`), validates it with the
grammar library before anything reaches the engine (`trio_llm.grammar.check`), and the
library user builds one with the constructors below.

JSON is compact by default (no whitespace between tokens): a JSON grammar that lets a small
model put whitespace anywhere lets it wander through spaces and newlines until max_tokens.
`whitespace_pattern` (a regex) allows whitespace where JSON does, matching that pattern.
"""

from __future__ import annotations

import enum
import json
from typing import Any

import msgspec


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


class Constraint(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    kind: ConstraintKind
    spec: str = ""
    whitespace_pattern: str | None = None
    """JSON kinds: the whitespace allowed between tokens, as a regex; None: none at all."""

    # -- constructors ---------------------------------------------------------------------

    @classmethod
    def json_schema(
        cls, schema: dict[str, Any] | str, *, whitespace_pattern: str | None = None
    ) -> Constraint:
        text = schema if isinstance(schema, str) else json.dumps(schema)
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

    # -- checks that need no grammar library ----------------------------------------------

    def validate(self) -> None:
        """Raise `ValueError` for a spec that cannot be one of its kind (the grammar library
        checks the rest: `trio_llm.grammar.check`)."""
        kind = self.kind
        if kind is ConstraintKind.JSON_OBJECT:
            return
        if not self.spec:
            raise ValueError(f"the {kind.name.lower()} constraint is empty")
        if kind is ConstraintKind.JSON_SCHEMA:
            try:
                schema = json.loads(self.spec)
            except ValueError as exc:
                raise ValueError(f"the JSON schema is not valid JSON: {exc}") from None
            if not isinstance(schema, dict | bool):
                raise ValueError("a JSON schema must be an object (or true/false)")
        elif kind is ConstraintKind.CHOICE:
            choices = self.choices
            if not choices or not all(isinstance(c, str) and c for c in choices):
                raise ValueError("choice must be a non-empty list of non-empty strings")

    @property
    def choices(self) -> list[str]:
        """A CHOICE constraint's strings."""
        try:
            choices = json.loads(self.spec)
        except ValueError:
            return []
        return choices if isinstance(choices, list) else []
