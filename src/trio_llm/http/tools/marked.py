"""The streaming parser of calls written between control markers: Qwen3-Coder's XML-like
`<function=...>`, DeepSeek-V3's `<｜tool▁call▁begin｜>...`, gpt-oss's Harmony commentary channel.

The same interface and invariants as parser.py's: text that might start a marker is held back;
a call's deltas concatenate to it; a region that holds no call comes back as content. A
DeepSeek or Harmony call starts once its head (its name, and the markers before its JSON
arguments) is complete, and its arguments are sent as they are written, short of anything that
may be their end; a Qwen3-Coder call (parameters whose types its schema decides) is read when
its closing marker arrives and comes as one delta with its id, name and arguments. Markers
are searched for only in text that could hold them, so each character is scanned a bounded
number of times. Harmony's channel headers (`dropped`) are neither content
nor calls.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from trio_llm.client.stop_strings import held_back
from trio_llm.http.tools.formats import DEEPSEEK_SEP, DEEPSEEK_V3, ToolFormat
from trio_llm.http.tools.parser import ToolCall, ToolCallDelta

_QWEN_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)(?:</function>\s*|$)", re.S)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)
_DEEPSEEK_V3 = re.compile(
    r"\s*(?:function)?" + re.escape(DEEPSEEK_SEP) + r"([^\n]+)\n```(?:json)?\n(.*?)(?:\n```\s*)?$",
    re.S,
)
_DEEPSEEK_V31 = re.compile(r"\s*([^\s<]+)" + re.escape(DEEPSEEK_SEP) + r"(.*)$", re.S)
_HARMONY = re.compile(r"([^\s<]+)\s*(?:<\|constrain\|>\s*\S*?)?\s*<\|message\|>(.*)$", re.S)
_HEADS = {
    "deepseek_v3": re.compile(
        r"\s*(?:"
        + re.escape(DEEPSEEK_V3.call_open)
        + r")?\s*(?:(?:function)?"
        + re.escape(DEEPSEEK_SEP)
        + r"([^\n]+)\n```(?:json)?\n|([^\s<]+)"
        + re.escape(DEEPSEEK_SEP)
        + r"(?=\s*\{))\s*"
    ),
    "openai": re.compile(r"([^\s<]+)\s*(?:<\|constrain\|>\s*\S*?)?\s*<\|message\|>\s*"),
}
"""A call's head, up to where its JSON arguments start, in the formats whose arguments are
streamed as they are written."""
_FENCE = "\n```"
_HEAD_WITHIN = 512
"""How far into a call its head is looked for."""


@dataclass
class MarkedCallParser:
    """See the module docstring. `schemas`: each tool's parameters schema, by name (a
    Qwen3-Coder value is text that its parameter's type says how to read)."""

    format: ToolFormat
    schemas: dict[str, Any] = field(default_factory=dict)
    calls: list[ToolCall] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _buf: str = ""
    """Text mode: what is held back; call mode: the region's text."""
    _in_region: bool = False
    _searched: int = 0
    """Call mode: where the next search for a closing marker starts."""
    _call_start: int = 0
    _region_calls: int = 0
    _streaming: ToolCall | None = None
    """The call whose arguments are being sent as they come (DeepSeek's, Harmony's)."""
    _args_at: int = 0
    """Where in the region the streaming call's arguments start."""
    _blank: str = ""
    """Whitespace after a call, held until text follows it."""
    _ended: bool = False

    # -- the interface ----------------------------------------------------------------------

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        if text:
            self._buf += text
            self._advance(content, deltas)
        out = "".join(content)
        self._content.append(out)
        return out, deltas

    def end(self) -> tuple[str, list[ToolCallDelta]]:
        if self._ended:
            return "", []
        self._ended = True
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        if self._in_region:
            self._close_region(self._buf, content, deltas, closed=False)
        else:
            self._text_out(content, self._buf)
        self._buf, self._blank = "", ""
        out = "".join(content)
        self._content.append(out)
        return out, deltas

    def finish(self) -> tuple[str, list[ToolCall]]:
        self.end()
        return "".join(self._content), list(self.calls)

    # -- text and regions -------------------------------------------------------------------

    def _text_out(self, content: list[str], text: str) -> None:
        if not self.calls:
            content.append(text)
            return
        text, self._blank = self._blank + text, ""
        if text.isspace():
            self._blank = text
        elif text:
            content.append(text)

    def _advance(self, content: list[str], deltas: list[ToolCallDelta]) -> None:
        while True:
            if self._in_region:
                if not self._region(content, deltas):
                    return
                continue
            tag = self.format.open_tag or ""
            marks = (tag, *self.format.dropped)
            found = [(at, m) for m in marks if (at := self._buf.find(m)) >= 0]
            if not found:
                keep = len(self._buf) - held_back(self._buf, marks)
                self._text_out(content, self._buf[:keep])
                self._buf = self._buf[keep:]
                return
            at, mark = min(found)
            self._text_out(content, self._buf[:at])
            self._buf = self._buf[at + len(mark) :]
            if mark == tag:
                self._in_region, self._searched, self._call_start = True, 0, 0
                self._region_calls = 0

    def _region(self, content: list[str], deltas: list[ToolCallDelta]) -> bool:
        """Read the calls the region's text completes; True when the region closed."""
        format, buf = self.format, self._buf
        close = format.close_tag or ""
        while True:
            ends = [
                (at, m)
                for m in (format.call_close, close)
                if m and (at := buf.find(m, self._searched)) >= 0
            ]
            if not ends:
                longest = max(len(format.call_close), len(close))
                self._searched = max(self._call_start, len(buf) - longest + 1)
                if format.name in _HEADS:
                    self._stream(deltas)
                return False
            at, mark = min(ends)
            if mark == format.call_close:
                self._read(buf[self._call_start : at], deltas, complete=True)
                self._call_start = self._searched = at + len(mark)
                continue
            self._close_region(buf[:at], content, deltas, closed=True)
            self._buf = buf[at + len(mark) :]
            return True

    def _close_region(
        self, region: str, content: list[str], deltas: list[ToolCallDelta], *, closed: bool
    ) -> None:
        rest = region[self._call_start :]
        unread = rest.strip() and not self._read(rest, deltas, complete=closed)
        if unread and self._region_calls == 0:
            closing = (self.format.close_tag or "") if closed else ""
            self._text_out(content, f"{self.format.open_tag}{region}{closing}")
        self._in_region = False

    def _stream(self, deltas: list[ToolCallDelta]) -> None:
        """Start the call once its head is complete, then send its arguments as they come,
        short of what may be its end (a closing marker, blanks, DeepSeek's closing fence)."""
        buf, call = self._buf, self._streaming
        if call is None:
            if len(buf) - self._call_start > _HEAD_WITHIN:
                return
            head = _HEADS[self.format.name].match(buf, self._call_start)
            if head is None or head.end() >= len(buf):
                return  # not yet (the arguments' first character shows the head is whole)
            name = next(g for g in head.groups() if g is not None).strip()
            call = self._streaming = ToolCall(self.format.new_call_id(), name, "")
            self._args_at = head.end()
            deltas.append(ToolCallDelta(len(self.calls), call.id, call.name))
            self.calls.append(call)
        ends = tuple(m for m in (_FENCE, self.format.call_close, self.format.close_tag) if m)
        upto = len(buf) - held_back(buf, ends)
        sent = self._args_at + len(call.arguments)
        fence = buf.find(_FENCE, max(self._args_at, sent - len(_FENCE)))
        if fence >= 0:  # DeepSeek's closing fence (JSON text holds no raw newline)
            upto = min(upto, fence)
        while upto > self._args_at and buf[upto - 1].isspace():
            upto -= 1
        text = buf[sent:upto]
        if text:
            call.arguments += text
            deltas.append(ToolCallDelta(len(self.calls) - 1, arguments=text))

    def _read(self, text: str, deltas: list[ToolCallDelta], *, complete: bool) -> bool:
        """Read one call's text; False when it is not one."""
        read = _read_call(self.format, text, self.schemas, complete=complete)
        call, self._streaming = self._streaming, None
        if call is not None:  # announced already: the rest of its arguments
            rest = ""
            if read is not None and read[1].startswith(call.arguments):
                rest = read[1][len(call.arguments) :]
            if rest:
                call.arguments += rest
                deltas.append(ToolCallDelta(len(self.calls) - 1, arguments=rest))
            self._region_calls += 1
            return True
        if read is None:
            return False
        name, arguments = read
        call = ToolCall(self.format.new_call_id(), name, arguments)
        deltas.append(ToolCallDelta(len(self.calls), call.id, call.name, arguments))
        self.calls.append(call)
        self._region_calls += 1
        return True


def _read_call(
    format: ToolFormat, text: str, schemas: dict[str, Any], *, complete: bool
) -> tuple[str, str] | None:
    """A call's name and arguments (JSON text) from its text; None when it is not a call. Cut
    off (`complete` False), a call keeps the arguments written so far."""
    if format.name == "qwen3_coder":
        match = _QWEN_FUNCTION.match(text)
        if match is None:
            return None
        name = match[1].strip()
        parameters = (schemas.get(name) or {}).get("properties") or {}
        arguments = {
            key.strip(): _typed(value, parameters.get(key.strip()))
            for key, value in _QWEN_PARAMETER.findall(match[2])
        }
        return name, json.dumps(arguments, ensure_ascii=False)
    text = text.removeprefix(format.call_open) if format.call_open else text
    if format.name == "deepseek_v3":
        text = text.lstrip().removeprefix(format.call_open)
        match = _DEEPSEEK_V3.match(text) or _DEEPSEEK_V31.match(text)
    else:
        match = _HARMONY.match(text)
    if match is None:
        return None
    arguments = match[2].strip()
    if complete or arguments.endswith("}"):
        try:
            if not isinstance(json.loads(arguments or "{}"), dict):
                return None
        except ValueError:
            if complete:
                return None
    return match[1].strip(), arguments or "{}"


def _typed(value: str, schema: Any) -> Any:
    """A Qwen3-Coder parameter's text as its schema says: text for a string (or a parameter
    without a schema), else JSON as the grammar writes it (text when it does not read)."""
    if value == "null":
        return None
    if not isinstance(schema, dict) or schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        if value.lower() in ("true", "false"):
            return value.lower() == "true"
        return value
