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
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import msgspec

from trio_llm.constraint import Constraint
from trio_llm.grammar import closed as closed
from trio_llm.grammar import lark_expression
from trio_llm.http.tools.call_rules import call_rule, schema_text
from trio_llm.http.tools.formats import ToolFormat
from trio_llm.http.tools.prompting import FunctionTool


def _call_schema(tool: FunctionTool, format: ToolFormat) -> str:
    """A whole call object, `{"name": ..., <arguments key>: ...}`, as one JSON schema."""
    arguments = json.loads(schema_text(tool))
    arguments.pop("x-guidance")
    schema = {
        "type": "object",
        "properties": {"name": {"const": tool.name}, format.arguments_key: arguments},
        "required": ["name", format.arguments_key],
        "additionalProperties": False,
        "x-guidance": {"whitespace_flexible": False},
    }
    return json.dumps(schema, ensure_ascii=False)


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


_GRAMMAR_CACHE = 64
_grammars: OrderedDict[tuple[Any, ...], str] = OrderedDict()
"""Tool grammars built lately, by the content of what they were built from: agents send the
same tools with every turn of a conversation."""


def tool_grammar(
    format: ToolFormat,
    tools: Sequence[FunctionTool],
    *,
    forced: bool,
    parallel: bool,
    answer: Constraint | None = None,
) -> str:
    """The Lark grammar for calls to `tools` in `format`: the whole answer when `forced`, else
    text with calls triggered lazily; `parallel`: more than one call allowed. `answer` (with
    `forced` False): the request's own constraint, which the answer must meet when it is not
    a call (then the calls start the answer: no text before them). Raises `ConstraintError`
    for an `answer` that cannot be offered beside calls (a grammar).

    Remembered by content (the tools as msgspec encodes them, a fraction of what building the
    grammar again, schema by schema, costs)."""
    key = (format.name, msgspec.json.encode(tools), forced, parallel, answer)
    grammar = _grammars.get(key)
    if grammar is None:
        grammar = _build(format, tools, forced, parallel, answer)
        _grammars[key] = grammar
        while len(_grammars) > _GRAMMAR_CACHE:
            _grammars.popitem(last=False)
    else:
        _grammars.move_to_end(key)
    return grammar


def _build(
    format: ToolFormat,
    tools: Sequence[FunctionTool],
    forced: bool,
    parallel: bool,
    answer: Constraint | None,
) -> str:
    lines = ["%llguidance {}"]
    names = []
    # A call whose object starts the answer, beside an answer that is JSON too (llama3_json
    # with a JSON answer), is one JSON schema: a call's head as one string lexeme would not
    # let the lexer fall back to the answer's `{` once the text stops matching it.
    whole = answer is not None and format.open_tag is None and format.reader == "json"
    for i, tool in enumerate(tools):
        if whole:
            lines.append(f"f{i}: %json {_call_schema(tool, format)}")
        else:
            lines.append(f"f{i}: {call_rule(format, tool)}")
        names.append(f"f{i}")
    lines.append("obj: " + " | ".join(names))
    if answer is not None:
        lines.append(f"answer: {lark_expression(answer)}")
    if format.open_tag is None:
        lines += _answer_start_rules(format, forced, parallel, answer is not None)
    else:
        lines += _tagged_rules(format, forced, parallel, answer is not None)
    return "\n".join(lines) + "\n"


def _tagged_rules(format: ToolFormat, forced: bool, parallel: bool, answer: bool) -> list[str]:
    """Calls in tags. Forced (required, or a named function): the answer is the calls, with
    a little whitespace (up to 8 characters) between and after them, so that a model that
    writes a newline after its last call can still end, and one that would go on talking, or
    sample blank lines, cannot (a tool choice of required asks for calls: a small model given
    room after them fills max_tokens). Otherwise, after
    the last call, the model may write text and end; text that opens another tag starts
    another call (a lazy lexeme: its text ends at the first tag), or none when only one call
    is allowed."""
    open_tag = _literal(format.open_tag or "")
    close = "" if format.close_tag is None or format.closes_output else format.close_tag
    close_tag = f" {_literal(close)}" if close else ""
    tag = _regex_literal(format.open_tag or "")
    rules = [
        "NL: /\\n?/",
        "WS: /[ \\t\\r\\n]{1,8}/",
        f"body: {_body(format, parallel, forced)}",
        "TEXT: /(.|\\n)+/",
        "ANY: /(.|\\n)*/",
        f"TAIL: /(.|\\n)+/ & ~/(.|\\n)*{tag}(.|\\n)*/",
        f"call_hd[lazy]: ANY {open_tag}",
        f"call: call_hd NL body NL{close_tag}",
        f"first: {open_tag} NL body NL{close_tag}",
    ]
    calls = "first call* TEXT?" if parallel else "first TAIL?"
    header = f"{_literal(format.header)}? " if format.header else ""
    if forced:
        rules.append(
            f"start: {header}first (WS? first)* WS?" if parallel else f"start: {header}first WS?"
        )
    elif answer:
        rules.append(f"start: {calls} | answer")
    else:
        rules.append("start: call* TEXT?" if parallel else "start: TEXT? | call TAIL?")
    return rules


def _body(format: ToolFormat, parallel: bool, forced: bool) -> str:
    """What one call region holds: a JSON list of calls or one (hermes, Mistral's and
    Granite's lists), calls each after the open tag again (Mistral's `name[ARGS]`), several
    marked calls (DeepSeek), or one (Qwen3-Coder, Harmony)."""
    if format.reader == "json" and format.args_marker and not format.lists:
        return f"obj ({_literal(format.open_tag or '')} obj)*" if parallel else "obj"
    if format.reader == "json":
        more = ' ("," NL obj)*' if parallel else ""
        more = ' ("," " "? NL obj)*' if parallel and format.close_tag is None else more
        # SmolLM2's prompt says to write an empty list when no call is needed: allowed with auto.
        empty = "" if forced else ' | "[" NL "]"'
        single = "" if format.close_tag is None else "obj | "
        return f'{single}"[" NL obj{more} NL "]"{empty}'
    if format.call_close:
        return "obj (NL obj)*" if parallel else "obj"
    return "obj"


def _answer_start_rules(
    format: ToolFormat, forced: bool, parallel: bool, answer: bool
) -> list[str]:
    """Calls that start the answer. llama3_json: objects, `; ` between them; pythonic: a
    Python list. After the calls, whitespace when forced (as for tagged calls), else any text
    that does not continue them."""
    if format.reader == "pythonic":
        calls = 'calls: "[" obj (", " obj)* "]"' if parallel else 'calls: "[" obj "]"'
        rules = [calls, "TAIL: /(.|\\n)+/", "TEXT: /[^\\[](.|\\n)*/"]
    else:
        calls = 'calls: obj ("; " obj)*' if parallel else "calls: obj"
        rules = [calls, "TAIL: /[^;](.|\\n)*/", "TEXT: /[^{](.|\\n)*/"]
    if forced:
        return [calls, "WS: /[ \\t\\r\\n]{1,8}/", "start: calls WS?"]
    if answer:
        return [*rules, "start: calls TAIL? | answer"]
    return [*rules, 'start: calls TAIL? | TEXT | ""']


def _regex_literal(text: str) -> str:
    """`text` matched literally inside a Lark regex."""
    return "".join(f"\\{c}" if c in _REGEX_META else c for c in text)


_REGEX_META = frozenset("\\/.+*?()|[]{}^$#&-~")
