"""`trio-llm chat`: a conversation in the terminal, with a running server (`--url`) or with an
engine this process starts (MODEL: the nursery client, no HTTP).

What it owns: the read loop on the main thread (readline for line editing and a history kept
between sessions), the conversation, and one backend that streams a reply:
- `HttpBackend` POSTs the server's /v1/chat/completions with `stream: true` and reads the
  server-sent events, with the standard library's http.client (no extra dependency);
- `EngineBackend` keeps `open_engine` open on an event loop in a background thread (the one
  `trio_llm.LLM` runs) and hands `generate()`'s deltas to the main thread through a queue.

Invariants: a backend's `stream()` is a generator, and leaving it early (Ctrl-C, an error)
aborts the reply where it runs: closing the HTTP connection makes the server abort the request,
and cancelling the `generate()` iteration aborts it in the engine. Ctrl-C while a reply streams
stops that reply and returns to the prompt, keeping what had arrived in the conversation; Ctrl-C
at the prompt clears the line; Ctrl-D or /exit leaves.

Why over 400 lines: it is one command, read in one sitting; its two backends, the conversation
and the terminal loop share a handful of small types (`Options`, `ReplyEnd`, `Backend`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.client
import json
import os
import queue
import sys
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trio_llm.llm import _Loop

Message = dict[str, str]
TEMPERATURE = 0.7
HELP = """\
/system TEXT               set the system prompt (/system alone clears it)
/set temperature T         sampling temperature (0: greedy)
/set max_tokens N | none   longest reply (none: to the end of the context)
/reset                     forget the conversation (the system prompt stays)
/exit                      leave (also Ctrl-D); Ctrl-C stops a reply that is streaming"""


class ChatError(Exception):
    """A reply that failed: the message says why, in the server's or the engine's words."""


@dataclass(frozen=True, slots=True)
class Options:
    temperature: float = TEMPERATURE
    max_tokens: int | None = None
    """None: up to the end of the context."""


@dataclass(frozen=True, slots=True)
class ReplyEnd:
    """The last thing a finished reply's stream yields."""

    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None


class Backend(Protocol):
    model: str
    where: str

    def stream(self, messages: list[Message], options: Options) -> Iterator[str | ReplyEnd]:
        """The reply's text pieces as they arrive, then its `ReplyEnd` if it finished."""
        ...

    def close(self) -> None: ...


# -- over HTTP ---------------------------------------------------------------------------------


class HttpBackend:
    """A running server's OpenAI API, one connection per request."""

    def __init__(
        self, url: str, *, api_key: str | None, model: str | None, timeout: float = 600.0
    ) -> None:
        parts = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ChatError(f"not an http(s) URL: {url}")
        self._parts = parts
        self._prefix = parts.path.rstrip("/").removesuffix("/v1")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = timeout
        self.where = f"{parts.scheme}://{parts.netloc}{self._prefix}"
        models = [card["id"] for card in self._get_json("/v1/models")["data"]]
        if model is not None and model not in models:
            raise ChatError(f"the server serves {', '.join(models)}, not {model}")
        self.model = model or models[0]

    def _connect(self) -> http.client.HTTPConnection:
        host, port = self._parts.hostname or "", self._parts.port
        if self._parts.scheme == "https":
            return http.client.HTTPSConnection(host, port, timeout=self._timeout)
        return http.client.HTTPConnection(host, port, timeout=self._timeout)

    def _send(
        self, connection: http.client.HTTPConnection, method: str, path: str, body: Any = None
    ) -> http.client.HTTPResponse:
        data = None if body is None else json.dumps(body).encode()
        try:
            connection.request(method, self._prefix + path, data, self._headers)
            response = connection.getresponse()
        except (OSError, http.client.HTTPException) as error:
            raise ChatError(f"cannot reach {self.where}: {error}") from None
        if response.status != 200:
            text = response.read().decode("utf-8", "replace")
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text.strip() or response.reason
            hint = (
                " (give the key with --api-key or TRIO_LLM_API_KEY)"
                if response.status == 401
                else ""
            )
            raise ChatError(f"{response.status}: {message}{hint}")
        return response

    def _get_json(self, path: str) -> Any:
        connection = self._connect()
        try:
            return json.loads(self._send(connection, "GET", path).read())
        finally:
            connection.close()

    def stream(self, messages: list[Message], options: Options) -> Iterator[str | ReplyEnd]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "temperature": options.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if options.max_tokens is not None:
            body["max_tokens"] = options.max_tokens
        connection = self._connect()
        try:  # closing the connection early is what makes the server abort the request
            response = self._send(connection, "POST", "/v1/chat/completions", body)
            finish_reason = None
            for line in response:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    return
                event = json.loads(data)
                if "error" in event:
                    raise ChatError(event["error"]["message"])
                for choice in event.get("choices") or ():
                    if text := choice["delta"].get("content"):
                        yield text
                    finish_reason = choice.get("finish_reason") or finish_reason
                if usage := event.get("usage"):
                    yield ReplyEnd(
                        usage["prompt_tokens"], usage["completion_tokens"], finish_reason
                    )
        except (OSError, http.client.HTTPException) as error:
            raise ChatError(f"the connection to {self.where} broke: {error!r}") from None
        finally:
            connection.close()

    def close(self) -> None:
        pass


# -- in this process ---------------------------------------------------------------------------

_END = object()


class EngineBackend:
    """An engine started by this process, held open on `trio_llm.LLM`'s event-loop thread."""

    def __init__(self, model: str | None, engine_args: dict[str, Any]) -> None:
        from trio_llm.llm import _Loop

        self._loop: _Loop = _Loop(model, engine_args)
        assert self._loop.client is not None
        self.model = self._loop.client.model_config.model
        self.where = "this process"

    def stream(self, messages: list[Message], options: Options) -> Iterator[str | ReplyEnd]:
        # Unbounded, but the reader is this thread printing: it keeps up with any engine.
        pieces: queue.SimpleQueue[object] = queue.SimpleQueue()
        future, scope = self._loop.submit(self._generate, messages, options, pieces)
        try:
            while (piece := pieces.get()) is not _END:  # Ctrl-C interrupts the wait
                yield piece  # type: ignore[misc]
            try:
                yield future.result()
            except Exception as error:
                raise ChatError(str(error)) from None
        finally:
            if not future.done():
                self._loop.cancel(scope)  # cancels the iteration: the engine aborts the request
                with contextlib.suppress(BaseException):
                    future.result()

    async def _generate(
        self, messages: list[Message], options: Options, pieces: queue.SimpleQueue[object]
    ) -> ReplyEnd:
        from trio_llm.sampling_params import RequestOutputKind, SamplingParams

        client = self._loop.client
        assert client is not None
        try:
            prompt = await client.apply_chat_template(messages)
            params = SamplingParams(
                max_tokens=options.max_tokens,
                temperature=options.temperature,
                output_kind=RequestOutputKind.DELTA,
            )
            tokens, finish_reason = 0, None
            async with aclosing(client.generate(prompt, params)) as outputs:
                async for output in outputs:
                    choice = output.outputs[0]
                    tokens += len(choice.token_ids)
                    finish_reason = choice.finish_reason
                    if choice.text:
                        pieces.put(choice.text)
            return ReplyEnd(len(prompt), tokens, finish_reason)
        finally:
            pieces.put(_END)

    def close(self) -> None:
        self._loop.stop()


# -- the conversation --------------------------------------------------------------------------


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

    def messages(self, text: str) -> list[Message]:
        system = [{"role": "system", "content": self.system}] if self.system else []
        return [*system, *self.history, {"role": "user", "content": text}]

    def command(self, line: str) -> bool:
        """Run a /command; False when it says to leave."""
        name, _, argument = line.partition(" ")
        if name in ("/exit", "/quit", "/bye"):
            return False
        if name == "/reset":
            self.history.clear()
            self.terminal.note("(conversation cleared)")
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
        if answer and not answer.endswith("\n"):
            self.terminal.write("\n")
        if error is not None and not answer:
            self.terminal.note(f"error: {error}")
            return
        self.history += [
            {"role": "user", "content": text},
            {"role": "assistant", "content": answer},
        ]
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


# -- the command -------------------------------------------------------------------------------


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        help="run this model in this process (default: the default model), unless --url is given",
    )
    parser.add_argument(
        "--url", help="talk to the server running there instead, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TRIO_LLM_API_KEY"),
        help="the server's key, with --url (default: $TRIO_LLM_API_KEY)",
    )
    parser.add_argument("--model", dest="served_model", help="with --url: which served model")
    parser.add_argument("--system", help="the system prompt to start with")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE)
    parser.add_argument("--max-tokens", type=int, help="per reply (default: to the context's end)")
    engine = parser.add_argument_group("the in-process engine (without --url)")
    engine.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    engine.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    engine.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    engine.add_argument("--kv-cache-memory", default="1GiB", help="e.g. 512MiB (default 1GiB)")
    engine.add_argument("--num-threads", type=int, help="torch threads (default: one per core)")


def run(args: argparse.Namespace) -> int:
    if args.url and args.model:
        print("trio-llm chat: give a MODEL or --url, not both", file=sys.stderr)
        return 2
    terminal = Terminal()
    try:
        backend = _open_backend(args, terminal)
    except ChatError as error:
        print(f"trio-llm chat: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        chat = Chat(backend, Options(args.temperature, args.max_tokens), terminal, args.system)
        terminal.note(
            f"chatting with {backend.model} ({backend.where}); /help for commands, "
            "Ctrl-C stops a reply, Ctrl-D leaves"
        )
        with _history():
            _loop(chat)
    finally:
        backend.close()
    return 0


def _open_backend(args: argparse.Namespace, terminal: Terminal) -> Backend:
    if args.url:
        return HttpBackend(args.url, api_key=args.api_key, model=args.served_model)
    from trio_llm.client import EngineStartError

    terminal.note(f"starting the engine for {args.model or 'the default model'}...")
    engine_args = {
        "dtype": args.dtype,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory,
        "num_threads": args.num_threads,
    }
    try:
        return EngineBackend(args.model, engine_args)
    except EngineStartError as error:
        raise ChatError(str(error)) from None


def _loop(chat: Chat) -> None:
    while True:
        try:
            line = input(">>> ").strip()
        except EOFError:
            chat.terminal.write("\n")
            return
        except KeyboardInterrupt:
            chat.terminal.write("\n")
            chat.terminal.note("(Ctrl-D or /exit leaves)")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if not chat.command(line):
                return
            continue
        chat.reply(line)


@contextlib.contextmanager
def _history() -> Iterator[None]:
    """Line editing, and the history kept in $XDG_STATE_HOME/trio-llm/chat_history."""
    try:
        import readline
    except ImportError:  # not on every platform; input() still works without it
        yield
        return
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    path = Path(state) / "trio-llm" / "chat_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
