"""The streaming parser of JSON tool calls (hermes, llama3_json, mistral, granite): a model's
output text in, content and tool calls out.

One parser per choice, fed the output's text as it arrives. It keeps the invariants a client
relies on:
- Text that might be the start of a call tag is held back, never sent as content; a held
  prefix that turns out not to be a tag is sent once that is known (or at the end).
- A call's first delta carries its index, id and name (as soon as the name is complete), the
  later ones fragments of its arguments; the fragments concatenate to the call's final
  `arguments`, which is the text the model wrote (so the streamed and the complete response
  agree exactly).
- Work is linear in the output: each character is scanned a bounded number of times, so a
  call whose arguments hold 50 KB of code costs no more per character than a short one. A
  call object's nesting is followed character by character (`_Pending.advance`: brackets
  outside strings), which says where its arguments and the object end; the object is then
  decoded once by the standard library, which has the last word on whether it is JSON. A
  call's name is read by `partial_json_parser` (only within the object's first 512
  characters, until the name is known).

A region that does not hold a call (`<tool_call>hello</tool_call>`: an unconstrained model's
mistake) comes back as content, unchanged. Output cut inside a call (max_tokens) ends that call
with the arguments written so far, as OpenAI's API does.

Mistral's v11 calls (`[TOOL_CALLS]name[ARGS]{...}`, the control token again before each) are
read in the same region: a bare name and its marker start the call, and the object that
follows is its arguments, streamed the same way.

Why over 400 lines: text mode, call mode and the nesting walker share the held-back state
that makes streamed and complete answers agree; the format-specific parts are data in
formats.py.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

import partial_json_parser
from partial_json_parser import Allow

from trio_llm.client.stop_strings import held_back
from trio_llm.http.tools.formats import ToolFormat


@dataclass(slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str
    """The arguments object as JSON text."""


@dataclass(slots=True)
class ToolCallDelta:
    """A piece of a streamed call: the first carries `id` and `name`, later ones arguments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


_BARE_NAME = re.compile(r"[A-Za-z0-9_.\-]*")
"""A call's name before Mistral's `[ARGS]` marker."""


_SEPARATORS = " \t\r\n[],;"
_HEADER = re.compile(r'\{\s*"name"\s*:\s*"(?:[^"\\]|\\.)*"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
"""A call object's start when its name comes first: where its arguments' text begins."""
_HEADER_WITHIN = 512
"""How far into a call object its name and the start of its arguments are looked for."""


@dataclass(slots=True)
class _Pending:
    """The call being read: where its object starts, its header once known, and how far its
    nesting has been followed."""

    start: int
    call: ToolCall | None = None
    args_start: int = -1
    """Where its arguments' text starts; -1: not streamed (the object is read whole)."""
    sent: int = 0
    """How far into the region its arguments have been sent."""
    scanned: int = -1
    """How far into the region the nesting has been followed."""
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    inner_end: int = -1
    """Where the first value nested in the object (a header-first call's arguments) ends."""
    end: int = -1
    """Where the object ends (just past its closing brace); -1: not yet."""
    bare: bool = False
    """The object is the arguments themselves (its name came before, `name[ARGS]{...}`)."""

    def advance(self, region: str, upto: int) -> None:
        """Follow the object's nesting through `region[:upto]`, stopping where it closes."""
        i = max(self.scanned, self.start)
        depth, in_string, escaped = self.depth, self.in_string, self.escaped
        while i < upto:
            char = region[i]
            i += 1
            if in_string:
                if escaped:
                    escaped = False
                elif char == "\\":
                    escaped = True
                elif char == '"':
                    in_string = False
            elif char == '"':
                in_string = True
            elif char in "{[":
                depth += 1
            elif char in "}]":
                depth -= 1
                if depth == 1 and self.inner_end < 0:
                    self.inner_end = i
                if depth == 0:
                    self.end = i
                    break
        self.scanned, self.depth, self.in_string, self.escaped = i, depth, in_string, escaped


@dataclass
class ToolCallParser:
    """See the module docstring. `feed` each piece of text, then `end` (a stream's last
    deltas) or `finish` (the whole content and every call)."""

    format: ToolFormat
    calls: list[ToolCall] = field(default_factory=list)
    _content: list[str] = field(default_factory=list)
    _text: str = ""
    """Text mode: what is held back (a possible start of the open tag)."""
    _in_call: bool = False
    _region: str = ""
    """Call mode: the text of the current call region (after the open tag)."""
    _region_calls: int = 0
    _pos: int = 0
    _pending: _Pending | None = None
    _invalid: bool = False
    _decided: bool = False
    """llama3_json: whether the answer's start has shown it is a call or text."""
    _ended: bool = False
    _blank: str = ""
    """Whitespace after a call, held until text follows it: a model that ends its answer with
    a newline after its calls has no content to show (a Responses output would otherwise get
    a message item of blank text)."""

    # -- the interface ----------------------------------------------------------------------

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """The content to send now, and the call deltas, for the next piece of output."""
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        if text:
            self._feed(text, content, deltas)
        out = "".join(content)
        self._content.append(out)
        return out, deltas

    def end(self) -> tuple[str, list[ToolCallDelta]]:
        """The output is complete: the held-back content and the last deltas."""
        if self._ended:
            return "", []
        self._ended = True
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        if self._in_call:
            self._close_region(content, deltas, closed=False)
        self._text_out(content, self._text)
        self._text, self._blank = "", ""
        out = "".join(content)
        self._content.append(out)
        return out, deltas

    def finish(self) -> tuple[str, list[ToolCall]]:
        """The whole content (every call's text taken out) and the calls."""
        self.end()
        return "".join(self._content), list(self.calls)

    # -- text mode --------------------------------------------------------------------------

    def _text_out(self, content: list[str], text: str) -> None:
        """Text outside calls is content, but whitespace after a call waits for text."""
        if not self.calls:
            content.append(text)
            return
        text, self._blank = self._blank + text, ""
        if text.isspace():
            self._blank = text
        else:
            content.append(text)

    def _feed(self, text: str, content: list[str], deltas: list[ToolCallDelta]) -> None:
        if self._in_call:
            self._feed_region(text, content, deltas)
            return
        tag = self.format.open_tag
        buffer = self._text + text
        if tag is None:
            self._feed_answer_start(buffer, content, deltas)
            return
        at = buffer.find(tag)
        if at < 0:
            held = held_back(buffer, (tag,))
            self._text_out(content, buffer[: len(buffer) - held])
            self._text = buffer[len(buffer) - held :]
            return
        self._text_out(content, buffer[:at])
        self._text = ""
        self._open_region()
        self._feed_region(buffer[at + len(tag) :], content, deltas)

    def _feed_answer_start(
        self, buffer: str, content: list[str], deltas: list[ToolCallDelta]
    ) -> None:
        """llama3_json: the answer is a call when it starts with `{`."""
        if self._decided:
            self._text_out(content, buffer)
            return
        stripped = buffer.lstrip()
        if not stripped:
            self._text = buffer
            return
        self._decided = True
        self._text = ""
        if stripped.startswith("{"):
            self._open_region()
            self._feed_region(stripped, content, deltas)
        else:
            content.append(buffer)

    def _open_region(self) -> None:
        self._in_call = True
        self._region = ""
        self._region_calls = 0
        self._pos = 0
        self._pending = None
        self._invalid = False

    # -- call mode --------------------------------------------------------------------------

    def _feed_region(self, text: str, content: list[str], deltas: list[ToolCallDelta]) -> None:
        close = self.format.close_tag
        searched = max(0, len(self._region) - len(close or "") + 1)
        # Appended through a local that holds the only reference, which CPython grows in
        # place: `self._region += text` would copy the whole region for every piece.
        region, self._region = self._region, ""
        region += text
        self._region = region
        del region
        if close is None:
            self._scan(len(self._region), deltas)
            return
        at = self._region.find(close, searched)
        if at < 0:
            visible = len(self._region) - held_back(self._region, (close,))
            self._scan(visible, deltas)
            return
        rest = self._region[at + len(close) :]
        self._region = self._region[:at]
        self._close_region(content, deltas, closed=True)
        if rest:
            self._feed(rest, content, deltas)

    def _close_region(
        self, content: list[str], deltas: list[ToolCallDelta], *, closed: bool
    ) -> None:
        """The region has ended (its close tag, or the output's end)."""
        self._scan(len(self._region), deltas)
        pending = self._pending
        if pending is not None and pending.call is not None:
            # Cut off inside the call: it keeps the arguments written so far.
            if pending.args_start >= 0:
                self._send_arguments(pending, len(self._region), deltas)
            self._region_calls += 1
        elif self._region_calls == 0 and _is_empty_list(self._region):
            pass  # "no call needed", as SmolLM2's prompt teaches
        elif self._region_calls == 0:
            tags = self.format
            opened = tags.open_tag or ""
            closing = (tags.close_tag or "") if closed else ""
            self._text_out(content, f"{opened}{self._region}{closing}")
        self._in_call = False
        self._pending = None
        self._region = ""

    def _scan(self, visible: int, deltas: list[ToolCallDelta]) -> None:
        """Read calls from the region's first `visible` characters."""
        region = self._region
        while not self._invalid:
            pending = self._pending
            if pending is None:
                pos, waiting = self._skip(self._pos, visible)
                self._pos = pos
                if waiting or pos >= visible:
                    return
                if region[pos] != "{":
                    if not self.format.args_marker:
                        self._invalid = True
                    elif self._read_bare_name(pos, visible, deltas):
                        continue
                    return
                pending = self._pending = _Pending(pos)
            pending.advance(region, visible)
            if pending.call is None:
                self._read_header(pending, visible, deltas)
            if pending.end >= 0:
                self._complete(pending, deltas)
                continue
            if pending.args_start >= 0:
                self._send_arguments(pending, visible, deltas)
            return

    def _skip(self, pos: int, visible: int) -> tuple[int, bool]:
        """Past separators and, inside a region that runs to the output's end, the open tags
        of further calls (Mistral's `[TOOL_CALLS]` before each); short of a possible tag."""
        region, tag = self._region, self.format.open_tag
        reopens = tag is not None and self.format.close_tag is None
        while pos < visible:
            if reopens and tag is not None and region[pos] == tag[0]:
                if region.startswith(tag, pos):
                    pos += len(tag)
                    continue
                if tag.startswith(region[pos:visible]):
                    return pos, True  # the tag may be coming
            if region[pos] not in _SEPARATORS:
                break
            pos += 1
        return pos, False

    def _read_bare_name(self, pos: int, visible: int, deltas: list[ToolCallDelta]) -> bool:
        """`name[ARGS]{...}`: start the call once its marker is seen (True); else wait or
        find the region invalid."""
        marker = self.format.args_marker
        name = _BARE_NAME.match(self._region, pos, visible)
        assert name is not None
        after = name.end()
        if after >= visible or marker.startswith(self._region[after:visible]):
            return False  # the name or the marker is still coming
        if not name.group() or not self._region.startswith(marker, after):
            self._invalid = True
            return False
        start = after + len(marker)
        call = ToolCall(self.format.new_call_id(), name.group(), "")
        self._pending = _Pending(start, call, args_start=start, sent=start, bare=True)
        deltas.append(ToolCallDelta(len(self.calls), call.id, call.name))
        self.calls.append(call)
        return True

    def _read_header(self, pending: _Pending, visible: int, deltas: list[ToolCallDelta]) -> None:
        """Start the call once its name is complete and its arguments are next."""
        if visible - pending.start > _HEADER_WITHIN:
            return  # the name is not first: the object is read whole
        text = self._region[pending.start : visible]
        try:
            partial = partial_json_parser.loads(text, Allow.ALL & ~Allow.STR)
        except Exception:  # the library raises its own and json's errors for bad prefixes
            return
        if not isinstance(partial, dict) or not isinstance(partial.get("name"), str):
            return
        if next(iter(partial)) != "name" or len(partial) < 2:
            return  # not name-then-arguments: read whole, when the object is complete
        header = _HEADER.match(self._region, pending.start, visible)
        if header is None or header.end() >= visible:
            return
        if self._region[header.end()] != "{":
            return  # arguments given as a string, or not an object: read whole
        call = ToolCall(self.format.new_call_id(), partial["name"], "")
        pending.call = call
        pending.args_start = pending.sent = header.end()
        deltas.append(ToolCallDelta(len(self.calls), call.id, call.name))
        self.calls.append(call)

    def _complete(self, pending: _Pending, deltas: list[ToolCallDelta]) -> None:
        """The object has closed: decode it (once), and finish its call."""
        region = self._region
        try:
            obj, end = json.JSONDecoder().raw_decode(region, pending.start)
        except ValueError:
            self._invalid = True
            return
        if pending.bare:
            arguments = json.dumps(obj, ensure_ascii=False) if isinstance(obj, dict) else None
        else:
            arguments = _arguments_of(obj, self.format)
        if arguments is None:
            self._invalid = True
            return
        call = pending.call
        if call is None:  # seen whole at once: keep the model's own text of the arguments
            header = _HEADER.match(region, pending.start, end)
            if header is not None:
                closing = region.rindex("}", header.end(), end)
                written = region[header.end() : closing].rstrip()
                if _same_json(written, arguments):
                    arguments = written
            call = ToolCall(self.format.new_call_id(), obj["name"], arguments)
            deltas.append(ToolCallDelta(len(self.calls), call.id, call.name, arguments))
            self.calls.append(call)
        elif pending.args_start >= 0:
            self._send_arguments(pending, end, deltas)
        self._region_calls += 1
        self._pending = None
        self._pos = end

    def _send_arguments(self, pending: _Pending, upto: int, deltas: list[ToolCallDelta]) -> None:
        """Send the arguments' text up to `upto`, never past their own closing brace."""
        if pending.inner_end >= 0 and not pending.bare:
            upto = min(upto, pending.inner_end)
        text = self._region[pending.sent : upto]
        if not text:
            return
        assert pending.call is not None
        pending.sent += len(text)
        pending.call.arguments += text
        index = self.calls.index(pending.call)
        deltas.append(ToolCallDelta(index, arguments=text))


def _arguments_of(obj: Any, format: ToolFormat) -> str | None:
    """A complete call object's arguments as JSON text; None when it is not a call."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    for key in format.arguments_keys:
        if key in obj:
            value = obj[key]
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    return None
            if not isinstance(value, dict):
                return None
            return json.dumps(value, ensure_ascii=False)
    return "{}"


def _is_empty_list(text: str) -> bool:
    try:
        return json.loads(text) == []
    except ValueError:
        return False


def _same_json(text: str, arguments: str) -> bool:
    try:
        return json.loads(text) == json.loads(arguments)
    except ValueError:
        return False
