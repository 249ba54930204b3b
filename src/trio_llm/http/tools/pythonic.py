"""The streaming parser of pythonic calls (Llama 3.2 and 4): an answer that is a Python list
of calls, `[get_weather(city="Paris"), now()]`.

The same interface and invariants as parser.py's. An answer that starts with `[` is held back
while its brackets are followed character by character (strings skipped), so the work is
linear in the output; when the list closes it is read once with `ast` (only literals, never
evaluated code) and its calls come out, each as one delta. A list that is not calls, or an
answer that does not start with `[`, is content, unchanged; an answer cut inside the list
(max_tokens) is content too, as the model wrote it.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

from trio_llm.http.tools.formats import ToolFormat
from trio_llm.http.tools.parser import ToolCall, ToolCallDelta

_NAMES = {"true": True, "false": False, "null": None, "True": True, "False": False, "None": None}
"""Bare names a value may be (JSON's spellings too, which a grammar's JSON writes)."""


@dataclass
class PythonicCallParser:
    """See the module docstring."""

    format: ToolFormat
    calls: list[ToolCall] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _buf: str = ""
    _state: str = "start"
    """start (blanks so far), list (inside the call list), text (the rest is content)."""
    _scanned: int = 0
    _depth: int = 0
    _quote: str = ""
    _escaped: bool = False
    _ended: bool = False

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        deltas: list[ToolCallDelta] = []
        out = self._advance(text, deltas) if text else ""
        self._content.append(out)
        return out, deltas

    def end(self) -> tuple[str, list[ToolCallDelta]]:
        if self._ended:
            return "", []
        self._ended = True
        out, self._buf = self._buf, ""
        if self.calls:
            out = "" if out.isspace() else out
        self._content.append(out)
        return out, []

    def finish(self) -> tuple[str, list[ToolCall]]:
        self.end()
        return "".join(self._content), list(self.calls)

    def _advance(self, text: str, deltas: list[ToolCallDelta]) -> str:
        self._buf += text
        if self._state == "start":
            stripped = self._buf.lstrip()
            if not stripped:
                return ""
            if not stripped.startswith("["):
                self._state = "text"
            else:
                self._state, self._buf = "list", stripped
        if self._state == "text":
            if self.calls and self._buf.isspace():
                return ""  # blanks after the calls wait: text may follow, or the end drops them
            out, self._buf = self._buf, ""
            return out
        end = self._walk()
        if end < 0:
            return ""
        listed, rest = self._buf[:end], self._buf[end:]
        self._state = "text"
        found = _read_calls(listed)
        if found is None:
            self._buf = ""
            return listed + rest
        for name, arguments in found:
            call = ToolCall(self.format.new_call_id(), name, arguments)
            deltas.append(ToolCallDelta(len(self.calls), call.id, call.name, arguments))
            self.calls.append(call)
        self._buf = rest if rest.isspace() else ""  # blanks wait: nothing may follow
        return "" if rest.isspace() else rest

    def _walk(self) -> int:
        """Follow the list's nesting from where the last piece ended; where it closes (just
        past its `]`), or -1."""
        buf, i = self._buf, self._scanned
        depth, quote, escaped = self._depth, self._quote, self._escaped
        while i < len(buf):
            char = buf[i]
            i += 1
            if quote:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == quote:
                    quote = ""
            elif char in "\"'":
                quote = char
            elif char in "([{":
                depth += 1
            elif char in ")]}":
                depth -= 1
                if depth == 0:
                    self._scanned = i
                    return i
        self._scanned, self._depth, self._quote, self._escaped = i, depth, quote, escaped
        return -1


def _read_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls of a Python list of calls (name, arguments as JSON text); None when it is not
    one."""
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or node.args or not isinstance(node.func, ast.Name):
            return None
        arguments = {}
        for keyword in node.keywords:
            if keyword.arg is None:
                return None
            try:
                arguments[keyword.arg] = _literal(keyword.value)
            except ValueError:
                return None
        calls.append((node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return calls


def _literal(node: ast.AST) -> Any:
    """A literal's value, with JSON's names allowed beside Python's."""
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(e) for e in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("a ** in a dict")
        return {str(_literal(k)): _literal(v) for k, v in zip(node.keys, node.values)}  # type: ignore[arg-type]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError("not a number")
        return -value
    if isinstance(node, ast.Constant) and isinstance(node.value, str | int | float | bool):
        return node.value
    if isinstance(node, ast.Constant) and node.value is None:
        return None
    raise ValueError("not a literal")
