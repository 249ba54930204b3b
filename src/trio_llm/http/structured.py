"""Structured-output request fields: OpenAI's `response_format`, vLLM's `structured_outputs` and
the legacy `guided_*`, turned into the one `Constraint` a request may carry.

What it owns: the fields' types (so /openapi.json shows them), the rules that combine them (at
most one constraint per request, exactly one kind inside `structured_outputs`), and their
checks that need no grammar library (a malformed spec is a 400 naming the parameter). The
check with the grammar library, off the event loop, is the generate skeleton's
(generate/endpoint.py), so these types import nothing with I/O. Invariant: every error is a
`ProtocolError` with its `param`.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from trio_llm.constraint import Constraint
from trio_llm.http.errors import bad_request


class JsonSchemaFormat(Struct, kw_only=True):
    """OpenAI's `response_format.json_schema`."""

    name: str
    description: str | None = None
    schema: dict[str, Any] | None = None
    """None: any JSON value."""
    strict: bool | None = None
    """Accepted; the schema is always enforced."""


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsParams(Struct, kw_only=True):
    """vLLM's `structured_outputs`: exactly one of json, regex, choice, grammar, json_object."""

    json: str | dict[str, Any] | None = None
    """A JSON schema (an object, or its JSON text)."""
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    """Lark (llguidance's syntax) or GBNF."""
    json_object: bool | None = None
    whitespace_pattern: str | None = None
    """JSON: the whitespace allowed between tokens, as a regex (default: none)."""


class StructuredFields(Struct, kw_only=True):
    """The request fields /v1/chat/completions and /v1/completions share for structured output."""

    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsParams | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None


_KINDS = ("json", "regex", "choice", "grammar", "json_object")


def schema_constraint(
    value: str | dict[str, Any], param: str, ws: str | None = None
) -> tuple[Constraint, str]:
    """A JSON schema field as a constraint and its parameter, or a 400 naming it (a schema
    nested too deeply to encode is refused before anything recurses through it)."""
    try:
        constraint = Constraint.json_schema(value, whitespace_pattern=ws)
    except ValueError as error:
        raise bad_request(f"Invalid {param}: {error}", param=param) from None
    return validated(constraint, param)


def _of_structured_outputs(so: StructuredOutputsParams) -> tuple[Constraint, str]:
    given = [k for k in _KINDS if getattr(so, k) not in (None, False)]
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise bad_request(
            f"structured_outputs takes exactly one of {', '.join(_KINDS)}; got {found}",
            param="structured_outputs",
        )
    [kind] = given
    ws = so.whitespace_pattern
    param = f"structured_outputs.{kind}"
    if kind == "json":
        assert so.json is not None
        return schema_constraint(so.json, param, ws)
    if kind == "json_object":
        return Constraint.json_object(whitespace_pattern=ws), param
    if kind == "regex":
        assert so.regex is not None
        return Constraint.regex(so.regex), param
    if kind == "choice":
        assert so.choice is not None
        return Constraint.choice(so.choice), param
    assert so.grammar is not None
    return Constraint.grammar(so.grammar), param


def constraint_of(request: StructuredFields) -> tuple[Constraint, str] | None:
    """The request's constraint and the parameter it came from; None when it asks for none.
    A 400 when it asks for more than one, or for a malformed one."""
    found: list[tuple[Constraint, str]] = []
    rf = request.response_format
    if rf is not None and rf.type == "json_object":
        found.append((Constraint.json_object(), "response_format"))
    elif rf is not None and rf.type == "json_schema":
        if rf.json_schema is None:
            raise bad_request(
                "response_format.json_schema is required when its type is json_schema",
                param="response_format.json_schema",
            )
        schema = rf.json_schema.schema if rf.json_schema.schema is not None else {}
        found.append(schema_constraint(schema, "response_format.json_schema.schema"))
    if request.structured_outputs is not None:
        found.append(_of_structured_outputs(request.structured_outputs))
    ws = request.guided_whitespace_pattern
    if request.guided_json is not None:
        found.append(schema_constraint(request.guided_json, "guided_json", ws))
    if request.guided_regex is not None:
        found.append((Constraint.regex(request.guided_regex), "guided_regex"))
    if request.guided_choice is not None:
        found.append((Constraint.choice(request.guided_choice), "guided_choice"))
    if request.guided_grammar is not None:
        found.append((Constraint.grammar(request.guided_grammar), "guided_grammar"))
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(param for _, param in found)
        raise bad_request(
            f"a request takes one structured-output constraint; got {names}", param=found[1][1]
        )
    return validated(*found[0])


def validated(constraint: Constraint, param: str) -> tuple[Constraint, str]:
    """`constraint` and its parameter, or a 400 naming it when its spec is malformed (the
    checks that need no grammar library)."""
    try:
        constraint.validate()
    except ValueError as error:
        raise bad_request(f"Invalid {param}: {error}", param=param) from None
    return constraint, param
