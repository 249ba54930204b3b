"""The grammar that makes a tool call well-formed: llguidance Lark built from the tools.

Forced (`required`, or a named function): the whole answer is one or more calls, each an object
`{"name": <one of the tools>, "arguments": <that tool's schema>}` inside the format's tags.
`auto`: a lazily triggered grammar: any text, until the model writes the format's trigger (the
open tag; llama3_json: a `{` at the start), and from there the call is constrained as when
forced. Either way a call the server returns parses and its arguments validate. Arguments are
compact JSON unless a tool's schema says otherwise (its own "x-guidance" options win), and hold
only the keys a schema lists (`closed`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from trio_llm.http.tools.formats import ToolFormat
from trio_llm.http.tools.prompting import FunctionTool

_NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def closed(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` wherever it lists `properties` and says
    nothing about others (in properties, items, anyOf and oneOf; not allOf, whose parts would
    then exclude each other's keys). What it accepts still validates against `schema`, and a
    small model can no longer add key after key until max_tokens (LangChain and pydantic send
    schemas without the keyword)."""
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: closed(v) for k, v in out["properties"].items()}
        out.setdefault("additionalProperties", False)
    if isinstance(out.get("items"), dict):
        out["items"] = closed(out["items"])
    for key in ("anyOf", "oneOf"):
        if isinstance(out.get(key), list):
            out[key] = [closed(s) for s in out[key]]
    if isinstance(out.get("$defs"), dict):
        out["$defs"] = {k: closed(v) for k, v in out["$defs"].items()}
    return out


def _schema(tool: FunctionTool) -> str:
    schema = closed(tool.parameters) if tool.parameters is not None else dict(_NO_ARGUMENTS)
    schema.setdefault("x-guidance", {"whitespace_flexible": False})
    return json.dumps(schema, ensure_ascii=False)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def tool_grammar(
    format: ToolFormat, tools: Sequence[FunctionTool], *, forced: bool, parallel: bool
) -> str:
    """The Lark grammar for calls to `tools` in `format`: the whole answer when `forced`, else
    text with calls triggered lazily; `parallel`: more than one call allowed."""
    lines = ["%llguidance {}"]
    names = []
    for i, tool in enumerate(tools):
        head = _literal(f'{{"name":{json.dumps(tool.name)},"{format.arguments_key}":')
        lines.append(f"f{i}: {head} %json {_schema(tool)} " + '"}"')
        names.append(f"f{i}")
    lines.append("obj: " + " | ".join(names))
    if format.open_tag is None:
        lines += _llama3_rules(forced, parallel)
    else:
        lines += _tagged_rules(format, forced, parallel)
    return "\n".join(lines) + "\n"


def _tagged_rules(format: ToolFormat, forced: bool, parallel: bool) -> list[str]:
    open_tag, close_tag = _literal(format.open_tag or ""), _literal(format.close_tag or "")
    more = ' ("," NL obj)*' if parallel else ""
    # SmolLM2's prompt says to write an empty list when no call is needed: allowed with auto.
    empty = "" if forced else ' | "[" NL "]"'
    rules = [
        "NL: /\\n?/",
        f'body: obj | "[" NL obj{more} NL "]"{empty}',
    ]
    if forced:
        rules.append(f"call: {open_tag} NL body NL {close_tag}")
        rules.append('start: call ("\\n" call)*' if parallel else "start: call")
    else:
        rules += [
            "TEXT: /(.|\\n)*/",
            f"call_hd[lazy]: TEXT {open_tag}",
            f"call: call_hd NL body NL {close_tag}",
            "start: call+ | TEXT" if parallel else "start: call | TEXT",
        ]
    return rules


def _llama3_rules(forced: bool, parallel: bool) -> list[str]:
    calls = 'calls: obj ("; " obj)*' if parallel else "calls: obj"
    if forced:
        return [calls, "start: calls"]
    return [calls, "TEXT: /[^{](.|\\n)*/", 'start: calls | TEXT | ""']
