"""A `Constraint` as llguidance grammar text, and the grammar engine's limits and errors in a
client's words.

What it owns: every choice of how a constraint becomes a grammar (compact JSON unless a
whitespace pattern is given; objects closed to the keys a schema lists unless it says
otherwise (`closed`); a choice as one lexeme; a grammar given as Lark or GBNF; the answer
after a think block), the limits every matcher runs under (`limits`), and `clean_error`, the
one way llguidance's messages reach a client (without its parser state or the grammar).
"""

from __future__ import annotations

import json
import re
from typing import Any

import llguidance
from llguidance import LLMatcher, LLParserLimits

from trio_llm.constraint import Constraint, ConstraintKind, Thinking

COMPACT_JSON: dict[str, Any] = {"whitespace_flexible": False}
"""llguidance's JSON options by default: no whitespace anywhere, the separators "," and ":"."""


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` wherever it lists `properties` and says
    nothing about others (in properties, items, prefixItems, anyOf, oneOf and definitions; not
    allOf, whose parts would then exclude each other's keys).

    What it accepts still validates against `schema`. Without it a small model adds key after
    key until max_tokens, since LangChain, pydantic and the OpenAI SDK's non-strict formats send
    schemas without the keyword; vLLM's default grammar engine (xgrammar, strict mode) closes
    objects the same way. A schema that wants extra keys says `additionalProperties: true`."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = closed(out["items"])
    for key in ("anyOf", "oneOf", "prefixItems"):
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    for key in ("$defs", "definitions"):
        if isinstance(out.get(key), dict):
            out[key] = {k: closed(v) for k, v in out[key].items()}
    return out


def _closed_text(spec: str) -> str:
    """A JSON schema's text with its objects `closed`; text that is not JSON is passed on for
    llguidance to refuse in its own words."""
    try:
        schema = json.loads(spec)
    except ValueError:
        return spec
    return json.dumps(closed(schema), ensure_ascii=False)


def limits() -> LLParserLimits:
    """The limits every matcher runs under: llguidance's own, without the parser state and
    grammar that its verbose errors append (they must not reach a client)."""
    return LLParserLimits(verbose_errors=False)


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
        schema = (
            _closed_text(constraint.spec)
            if kind is ConstraintKind.JSON_SCHEMA
            else '{"type": "object"}'
        )
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
        schema = closed(json.loads(constraint.spec)) if kind is ConstraintKind.JSON_SCHEMA else {}
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
    header = ""
    if thinking.header:
        header = json.dumps(thinking.header, ensure_ascii=False) + "? "
    lark = [
        "%llguidance {}",
        f"start: {opening}thought GAP {header}@answer",
        f"thought[suffix={close}]: /(.|\\n)*/",
        f"GAP: {_THINK_GAP}",
    ]
    return json.dumps({"grammars": [{"lark_grammar": "\n".join(lark)}, *inner]})
