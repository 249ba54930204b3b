"""The streaming reasoning parser: a model's output text in, its thinking and its answer out.

One parser per choice, fed the output's text as it arrives, shared by chat
(`reasoning_content`), the Responses API (`reasoning` items) and the Messages API (`thinking`
blocks). It keeps the invariants a client relies on:
- Text that might be the start of a tag is held back, never sent as thinking or as answer; a
  held prefix that turns out not to be a tag is sent once that is known (or at the end).
- The thinking is what lies between the tags, without the whitespace around it; the answer is
  what follows the closing tag, without the whitespace that separates them (Qwen3 writes a
  blank line). An output that opens no block is all answer, unchanged.
- Work is incremental: the closing tag is searched for only in text that could hold it, so
  each character is scanned a bounded number of times.

Where the output starts is the caller's to say (`inside`): a prompt that opened the block
(DeepSeek-R1's template writes `<think>\\n`) makes the output thinking from its first character;
otherwise only an open tag at the very start of the output begins a block. An output cut inside
the block (max_tokens) is all thinking.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from trio_llm.client.stop_strings import held_back
from trio_llm.http.reasoning.formats import ReasoningFormat


class _State(enum.Enum):
    START = "start"
    """Before the output's first non-blank character: a block may open."""
    THINKING = "thinking"
    ANSWER = "answer"


@dataclass
class ReasoningParser:
    """See the module docstring. `feed` each piece of text, then `end` (a stream's last
    pieces) or `finish` (the whole thinking and answer)."""

    format: ReasoningFormat
    inside: bool = False
    """The output starts inside the think block (the prompt opened it)."""
    _state: _State = field(default=_State.START, init=False)
    _buf: str = field(default="", init=False)
    """Text not sent yet: a possible tag, or blanks that may turn out to be trailing."""
    _scan: int = field(default=0, init=False)
    """Where in `_buf` the closing tag may start (what lies before was searched)."""
    _begun: bool = field(default=False, init=False)
    """Thinking: some of it was sent (leading blanks are dropped until then)."""
    _gap: bool = field(default=False, init=False)
    """Answer: the blanks after the closing tag are still being dropped."""
    _heading: bool = field(default=False, init=False)
    """Answer: the format's control heads may still come (Harmony's channel header)."""
    _thought: bool = field(default=False, init=False)
    _ended: bool = field(default=False, init=False)
    _reasoning: list[str] = field(default_factory=list, init=False)
    _content: list[str] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.inside:
            self._state, self._thought = _State.THINKING, True

    # -- the interface ----------------------------------------------------------------------

    def feed(self, text: str) -> tuple[str, str]:
        """The thinking and the answer to send now, for the next piece of output."""
        reasoning: list[str] = []
        content: list[str] = []
        if text:
            self._buf += text
            self._advance(reasoning, content)
        return self._sent(reasoning, content)

    def end(self) -> tuple[str, str]:
        """The output is complete: what was held back."""
        if self._ended:
            return "", ""
        self._ended = True
        reasoning: list[str] = []
        content: list[str] = []
        rest, self._buf = self._buf, ""
        if self._state is _State.THINKING:
            self._think(rest.rstrip(), reasoning)
        elif self._state is _State.START or not self._gap:
            content.append(rest)
        return self._sent(reasoning, content)

    def finish(self) -> tuple[str | None, str]:
        """The whole thinking (None when there was none) and the whole answer."""
        self.end()
        return "".join(self._reasoning) or None, "".join(self._content)

    @property
    def thinking(self) -> bool:
        """Whether the output is inside the think block now."""
        return self._state is _State.THINKING

    # -- the states -------------------------------------------------------------------------

    def _sent(self, reasoning: list[str], content: list[str]) -> tuple[str, str]:
        r, c = "".join(reasoning), "".join(content)
        self._reasoning.append(r)
        self._content.append(c)
        return r, c

    def _advance(self, reasoning: list[str], content: list[str]) -> None:
        while True:
            if self._state is _State.START:
                if not self._start(content):
                    return
            elif self._state is _State.THINKING:
                if not self._thinking(reasoning):
                    return
            else:
                self._answer(content)
                return

    def _start(self, content: list[str]) -> bool:
        """Whether the block opened (the rest is thinking); else hold or send the answer."""
        stripped = self._buf.lstrip()
        opens = self.format.open_tags
        tag = next((t for t in opens if stripped.startswith(t)), None)
        if tag is not None:
            self._buf = stripped[len(tag) :]
            self._state, self._thought, self._scan = _State.THINKING, True, 0
            return True
        if not stripped or any(t.startswith(stripped) for t in opens):
            return False  # blanks, or the start of a tag: wait
        self._state = _State.ANSWER
        if self.format.answer_heads:
            self._heading = True
            return True
        content.append(self._buf)
        self._buf = ""
        return False

    def _thinking(self, reasoning: list[str]) -> bool:
        """Whether the block closed (the rest is answer); else send what cannot be a tag."""
        buf = self._buf
        if not self._begun and self.inside:  # a model may open the block the prompt opened
            stripped = buf.lstrip()
            opening = self.format.open_tag
            if stripped.startswith(opening):
                buf = self._buf = stripped[len(opening) :]
            elif opening.startswith(stripped):
                return False
        closes = self.format.close_tags
        found = [(at, c) for c in closes if (at := buf.find(c, self._scan)) >= 0]
        if found:
            at, close = min(found)
            self._think(buf[:at].rstrip(), reasoning)
            self._buf = buf[at + len(close) :]
            self._state, self._gap = _State.ANSWER, True
            self._heading = bool(self.format.answer_heads)
            return True
        keep = len(buf) - held_back(buf, closes)
        sent = buf[:keep].rstrip()
        self._think(sent, reasoning)
        self._buf = buf[len(sent) :]
        self._scan = max(0, len(self._buf) - max(map(len, closes)) + 1)
        return False

    def _think(self, text: str, reasoning: list[str]) -> None:
        if not self._begun:
            text = text.lstrip()
            self._begun = bool(text)
        if text:
            reasoning.append(text)

    def _answer(self, content: list[str]) -> None:
        if self._gap:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return
            self._gap = False
        while self._heading:
            heads = self.format.answer_heads
            head = next((h for h in heads if self._buf.startswith(h)), None)
            if head is not None:
                self._buf = self._buf[len(head) :]
            elif any(h.startswith(self._buf) for h in heads):
                return  # a head may be coming (or nothing yet)
            else:
                self._heading = False
        content.append(self._buf)
        self._buf = ""
