"""One call to one tool as a grammar rule, in each format's syntax: the piece of the tool
grammar (grammar.py) that differs between formats.

A JSON format's call is the object's head as one literal, then the arguments' schema as
`%json` (Mistral's v11 form: `name[ARGS]` then the schema). The others write the arguments
their own way: Harmony's and DeepSeek's as JSON after the name's markers; pythonic's as keyword
arguments, each a Python literal (`True`, not `true`); Qwen3-Coder's as `<parameter=...>`
blocks of plain text. Every rule accepts only calls the matching parser reads back with
arguments that validate (a Qwen3-Coder string holds no `<` and no newline: the constraint
keeps a call readable rather than allowing every value).
"""

from __future__ import annotations

import json
from typing import Any

from trio_llm.grammar import closed
from trio_llm.http.tools.formats import DEEPSEEK_SEP, ToolFormat
from trio_llm.http.tools.prompting import FunctionTool

_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def schema_text(tool: FunctionTool) -> str:
    """A tool's arguments schema as the grammar's `%json` takes it (closed, compact)."""
    schema = closed(tool.parameters) if tool.parameters is not None else dict(_NO_ARGUMENTS)
    schema.setdefault("x-guidance", {"whitespace_flexible": False})
    return json.dumps(schema, ensure_ascii=False)


def call_rule(format: ToolFormat, tool: FunctionTool) -> str:
    """The right-hand side of the rule of one call to `tool` in `format`."""
    name = tool.name
    if format.reader == "pythonic":
        return f"{_literal(name + '(')} {_keyword_arguments(tool)} {_literal(')')}"
    if format.name == "qwen3_coder":
        return f"{_literal(f'<function={name}>' + chr(10))} {_parameters(tool)} " + _literal(
            "</function>"
        )
    if format.name == "deepseek_v3":
        head = f"{format.call_open}function{DEEPSEEK_SEP}{name}\n```json\n"
        tail = f"\n```{format.call_close}"
        return f"{_literal(head)} %json {schema_text(tool)} {_literal(tail)}"
    if format.name == "openai":
        return f"{_literal(name + ' <|constrain|>json<|message|>')} %json {schema_text(tool)}"
    if format.args_marker and not format.lists:
        return f"{_literal(name + format.args_marker)} %json {schema_text(tool)}"
    head = _literal(f'{{"name":{json.dumps(name)},"{format.arguments_key}":')
    return f"{head} %json {schema_text(tool)} " + '"}"'


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _ordered(tool: FunctionTool) -> list[tuple[str, Any, bool]]:
    """The tool's parameters, required ones first: (name, schema, required)."""
    schema = tool.parameters or {}
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        return []
    required = set(schema.get("required") or ())
    listed = [(k, closed(v), k in required) for k, v in properties.items()]
    return [p for p in listed if p[2]] + [p for p in listed if not p[2]]


def _sequence(items: list[tuple[str, bool]], separator: str) -> str:
    """Items in order (the required ones first), `separator` between them, each optional one
    left out or not; with none required, a later optional one only after the first."""
    sep = _literal(separator) + " " if separator else ""
    required = [text for text, needed in items if needed]
    optional = [text for text, needed in items if not needed]
    if required:
        out = f" {sep}".join(required)
        return out + "".join(f" ({sep}{text})?" for text in optional)
    if not optional:
        return '""'
    return "(" + optional[0] + "".join(f" ({sep}{text})?" for text in optional[1:]) + ")?"


def _keyword_arguments(tool: FunctionTool) -> str:
    items = [
        (f"{_literal(name + '=')} {_python_value(schema)}", required)
        for name, schema, required in _ordered(tool)
    ]
    return _sequence(items, ", ")


def _python_value(schema: Any) -> str:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "boolean":
        return '("True" | "False")'
    if kind == "null":
        return '"None"'
    return f"%json {_value_schema(schema)}"


def _parameters(tool: FunctionTool) -> str:
    items = []
    for name, schema, required in _ordered(tool):
        head = _literal(f"<parameter={name}>\n")
        tail = _literal("\n</parameter>\n")
        items.append((f"{head} {_plain_value(schema)} {tail}", required))
    return _sequence(items, "")


def _plain_value(schema: Any) -> str:
    """A Qwen3-Coder value: a string as its text, anything else as JSON."""
    if not isinstance(schema, dict) or schema.get("type") != "string":
        return f"%json {_value_schema(schema)}"
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return "(" + " | ".join(_literal(v) for v in schema["enum"]) + ")"
    longest = schema.get("maxLength")
    bound = f"{{1,{int(longest)}}}" if isinstance(longest, int) and longest >= 1 else "+"
    return f"/[^<\\n]{bound}/"


def _value_schema(schema: Any) -> str:
    schema = dict(schema) if isinstance(schema, dict) else {}
    schema.setdefault("x-guidance", {"whitespace_flexible": False})
    return json.dumps(schema, ensure_ascii=False)
