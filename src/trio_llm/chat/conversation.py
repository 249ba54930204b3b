"""The conversation in the terminal: what the person sees, the history sent with each turn, the
/commands, and a reply streamed with a line of numbers after it.

Invariant: Ctrl-C while a reply streams stops that reply and keeps what had arrived in the
conversation; a reply that failed before writing anything leaves the conversation as it was.
Pictures attached with /image go with the next message only, and stay in the history with it
(a later turn sends them again, which the server's prefix cache makes cheap); a reply that
failed drops them, so that a picture the model cannot read does not fail every later turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
import mimetypes
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trio_llm.chat.backends import Backend, ChatError, Message, Options, ReplyEnd, image_part

HELP = """\
/system TEXT               set the system prompt (/system alone clears it)
/set temperature T         sampling temperature (0: greedy)
/set max_tokens N | none   longest reply (none: to the end of the context)
/image PATH                attach a picture to your next message (vision models)
/reset                     forget the conversation (the system prompt stays)
/exit                      leave (also Ctrl-D); Ctrl-C stops a reply that is streaming"""


class Terminal:
    """What the person sees: replies as they stream, and a dim line of numbers after each."""

    def __init__(self, out: Any = None) -> None:
        self.out = out or sys.stdout
        color = self.out.isatty() and not os.environ.get("NO_COLOR")
        self._dim, self._plain = ("\x1b[2m", "\x1b[0m") if color else ("", "")

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def note(self, text: str) -> None:
        self.write(f"{self._dim}{text}{self._plain}\n")


@dataclass
class Chat:
    backend: Backend
    options: Options
    terminal: Terminal
    system: str | None = None

    def __post_init__(self) -> None:
        self.history: list[Message] = []
        self.pictures: list[dict[str, Any]] = []
        """Content parts of the pictures attached to the next message."""

    def messages(self, text: str) -> list[Message]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, self._user(text)]

    def _user(self, text: str) -> Message:
        if not self.pictures:
            return {"role": "user", "content": text}
        return {"role": "user", "content": [*self.pictures, {"type": "text", "text": text}]}

    def command(self, line: str) -> bool:
        """Run a /command; False when it says to leave."""
        name, _, argument = line.partition(" ")
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/reset":
            self.history.clear()
            self.pictures.clear()
            self.terminal.note("(conversation cleared)")
        elif name == "/image":
            self._attach(argument.strip())
        elif name == "/system":
            self.system = argument.strip() or None
            self.terminal.note("(system prompt set)" if self.system else "(system prompt cleared)")
        elif name == "/set":
            self._set(*argument.split())
        elif name in ("/help", "/?"):
            self.terminal.note(HELP)
        else:
            self.terminal.note(f"unknown command {name}; /help lists them")
        return True

    def _attach(self, argument: str) -> None:
        if not self.backend.takes_images:
            self.terminal.note(
                f"/image: {self.backend.model} takes text only; pictures need a "
                "vision-language model (e.g. a SmolVLM or LLaVA directory)"
            )
            return
        if not argument:
            self.terminal.note("usage: /image PATH (a PNG, JPEG, WebP, GIF or BMP file)")
            return
        path = Path(argument).expanduser()
        mime = mimetypes.guess_type(path.name)[0]
        if mime is None or not mime.startswith("image/"):
            self.terminal.note(f"/image: {path} is not a picture by its name (.png, .jpg, ...)")
            return
        try:
            data = path.read_bytes()
        except OSError as exc:
            self.terminal.note(f"/image: cannot read {path}: {exc.strerror or exc}")
            return
        self.pictures.append(image_part(data, mime))
        count = len(self.pictures)
        self.terminal.note(
            f"({path.name} attached to your next message"
            + (f"; {count} pictures)" if count > 1 else ")")
        )

    def _set(self, *words: str) -> None:
        try:
            [name, value] = words
            if name == "temperature":
                self.options = dataclasses.replace(self.options, temperature=float(value))
            elif name == "max_tokens":
                tokens = None if value == "none" else int(value)
                if tokens is not None and tokens < 1:
                    raise ValueError(value)
                self.options = dataclasses.replace(self.options, max_tokens=tokens)
            else:
                raise ValueError(name)
        except ValueError:
            self.terminal.note("usage: /set temperature T, or /set max_tokens N|none")
            return
        self.terminal.note(f"({name} = {value})")

    def reply(self, text: str) -> None:
        """Stream the model's answer to `text`; Ctrl-C stops it."""
        started = time.monotonic()
        first = last = None
        pieces: list[str] = []
        usage: ReplyEnd | None = None
        stopped = False
        error: str | None = None
        with contextlib.closing(self.backend.stream(self.messages(text), self.options)) as stream:
            try:
                for piece in stream:
                    if isinstance(piece, ReplyEnd):
                        usage = piece
                        continue
                    last = time.monotonic()
                    first = first or last
                    pieces.append(piece)
                    self.terminal.write(piece)
            except KeyboardInterrupt:
                stopped = True
            except ChatError as exc:
                error = str(exc)
        answer = "".join(pieces)
        user = self._user(text)
        dropped = len(self.pictures)
        self.pictures = []
        if answer and not answer.endswith("\n"):
            self.terminal.write("\n")
        if error is not None and not answer:
            lost = f" ({dropped} picture{'s' if dropped > 1 else ''} dropped)" if dropped else ""
            self.terminal.note(f"error: {error}{lost}")
            return
        self.history += [user, {"role": "assistant", "content": answer}]
        self.terminal.note(_numbers(started, first, last, len(pieces), usage, stopped, error))


def _numbers(
    started: float,
    first: float | None,
    last: float | None,
    pieces: int,
    usage: ReplyEnd | None,
    stopped: bool,
    error: str | None,
) -> str:
    # Without usage (a stopped reply over HTTP) the count is of events, about one a token.
    tokens, approx = (usage.completion_tokens, "") if usage else (pieces, "≈")
    parts = [f"{approx}{tokens} token{'' if tokens == 1 else 's'}"]
    if first is not None:
        parts.append(f"TTFT {first - started:.2f} s")
    if first is not None and last is not None and last > first and tokens > 1:
        parts.append(f"{approx}{(tokens - 1) / (last - first):.1f} tok/s")
    if usage:
        parts.append(f"prompt {usage.prompt_tokens} tokens")
    if stopped:
        parts.append("stopped")
    elif usage and usage.finish_reason == "length":
        parts.append("cut at max tokens")
    if error:
        parts.append(f"error: {error}")
    return "[" + " · ".join(parts) + "]"
