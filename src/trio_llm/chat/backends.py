"""The chat's backends: what streams a reply, from a running server or from an engine this
process starts.

What it owns: the types the conversation and its backends share (`Options`, `ReplyEnd`,
`Backend`, `ChatError`) and the two backends:
- `HttpBackend` POSTs the server's /v1/chat/completions with `stream: true` and reads the
  server-sent events, with the standard library's http.client (no extra dependency);
- `EngineBackend` keeps `open_engine` open on an event loop in a background thread (the one
  `trio_llm.LLM` runs) and hands `generate()`'s deltas to the main thread through a queue.

A user message with pictures has the OpenAI form (a list of `image_url` parts with data: URLs,
then a `text` part), which the HTTP backend sends as it is and the engine backend turns into
what the server would: the model's image token where each picture was, the pictures expanded
by the model's processor.

Invariant: a backend's `stream()` is a generator, and leaving it early (Ctrl-C, an error)
aborts the reply where it runs: closing the HTTP connection makes the server abort the request,
and cancelling the `generate()` iteration aborts it in the engine.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import queue
import urllib.parse
from collections.abc import Iterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from trio_llm.llm import _Loop

Message = dict[str, Any]
"""{"role": ..., "content": text, or a user's list of OpenAI content parts}."""
TEMPERATURE = 0.7


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
    takes_images: bool
    """Whether the model reads pictures: `/image` is refused up front for one that does not,
    rather than by an error after the person has typed the question."""

    def stream(self, messages: list[Message], options: Options) -> Iterator[str | ReplyEnd]:
        """The reply's text pieces as they arrive, then its `ReplyEnd` if it finished."""
        ...

    def close(self) -> None: ...


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
        cards = {card["id"]: card for card in self._get_json("/v1/models")["data"]}
        if model is not None and model not in cards:
            raise ChatError(f"the server serves {', '.join(cards)}, not {model}")
        self.model = model or next(iter(cards))
        self.takes_images = "image" in (cards[self.model].get("input_modalities") or ())

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


_END = object()


class EngineBackend:
    """An engine started by this process, held open on `trio_llm.LLM`'s event-loop thread."""

    def __init__(self, model: str | None, engine_args: dict[str, Any]) -> None:
        from trio_llm.llm import _Loop

        self._loop: _Loop = _Loop(model, engine_args)
        assert self._loop.client is not None
        self.model = self._loop.client.model_config.model
        self.where = "this process"
        self.takes_images = self._loop.client.images is not None

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
        from trio_llm.client.images import ImagePrompt
        from trio_llm.sampling_params import RequestOutputKind, SamplingParams

        client = self._loop.client
        assert client is not None
        try:
            token = client.images.image_token if client.images is not None else ""
            texts, pictures = _with_image_tokens(messages, token)
            prompt: list[int] | ImagePrompt = await client.apply_chat_template(texts)
            if pictures:
                prompt = await client.expand_images(prompt, pictures)  # type: ignore[arg-type]
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
            length = len(prompt.token_ids if isinstance(prompt, ImagePrompt) else prompt)
            return ReplyEnd(length, tokens, finish_reason)
        finally:
            pieces.put(_END)

    def close(self) -> None:
        self._loop.stop()


def image_part(data: bytes, mime: str) -> dict[str, Any]:
    """A picture as an OpenAI chat content part (a data: URL)."""
    url = f"data:{mime};base64,{base64.b64encode(data).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _with_image_tokens(messages: list[Message], token: str) -> tuple[list[Message], list[bytes]]:
    """The messages with text content only, `token` (the model's image token, which its
    processor expands) where each picture was, and the pictures' bytes in prompt order."""
    texts: list[Message] = []
    pictures: list[bytes] = []
    for message in messages:
        content = message["content"]
        if isinstance(content, list):
            pieces = []
            for part in content:
                if part["type"] == "image_url":
                    pictures.append(base64.b64decode(part["image_url"]["url"].split(",", 1)[1]))
                    pieces.append(token)
                else:
                    pieces.append(part["text"])
            content = "\n".join(pieces)  # as the server joins a message's parts
        texts.append({**message, "content": content})
    return texts, pictures
