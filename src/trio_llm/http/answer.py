"""One choice's output read the way a client wants it: the thinking, the answer's text and its
tool calls, split apart as the text arrives.

The reasoning parser (http/reasoning) goes first and the tool-call parser (http/tools) reads
only what it says is the answer, so a call written while thinking is thinking, and a `<think>`
tag never reaches the tool parser. Every endpoint that generates text for a conversation (chat,
Responses, Messages) builds its output from one `AnswerReader` per choice; with neither parser
the text passes through unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trio_llm.http.reasoning import ReasoningParser
from trio_llm.http.tools import CallParser, ToolCall, ToolCallDelta


@dataclass(slots=True)
class Piece:
    """What one piece of output (or its end) gives."""

    reasoning: str = ""
    content: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass
class AnswerReader:
    """`feed` each piece of text, then `end` (a stream's last piece) or `finish` (the whole)."""

    reasoning: ReasoningParser | None = None
    tools: CallParser | None = None
    _content: list[str] = field(default_factory=list, init=False)
    _ended: bool = field(default=False, init=False)

    def feed(self, text: str) -> Piece:
        thought, content = ("", text) if self.reasoning is None else self.reasoning.feed(text)
        return self._answer(thought, content, end=False)

    def end(self) -> Piece:
        if self._ended:
            return Piece()
        self._ended = True
        thought, content = ("", "") if self.reasoning is None else self.reasoning.end()
        return self._answer(thought, content, end=True)

    def finish(self) -> tuple[str | None, str, list[ToolCall]]:
        """The whole thinking (None: none), the answer's text (calls taken out), the calls."""
        self.end()
        reasoning = None if self.reasoning is None else self.reasoning.finish()[0]
        if self.tools is None:
            return reasoning, "".join(self._content), []
        content, calls = self.tools.finish()
        return reasoning, content, calls

    @property
    def plain(self) -> bool:
        """Whether the text passes through unread (no thinking, no calls to split out)."""
        return self.reasoning is None and self.tools is None

    @property
    def thinking(self) -> bool:
        """Whether the output is inside its think block now."""
        return self.reasoning is not None and self.reasoning.thinking

    def _answer(self, thought: str, content: str, *, end: bool) -> Piece:
        if self.tools is None:
            self._content.append(content)
            return Piece(thought, content)
        calls: list[ToolCallDelta] = []
        if content or not end:
            content, calls = self.tools.feed(content)
        if end:
            more, last = self.tools.end()
            content, calls = content + more, calls + last
        return Piece(thought, content, calls)
