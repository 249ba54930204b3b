"""The bodies of a request and its answer, as every handler reads and writes them: the JSON
body in (`read_body`, `decode_body`), JSON out (`json_response`, `error_response`).

Invariant: a body that is not JSON is a 415, one past the size limit a 413, one that does not
decode a 400 naming the parameter (http/wire.py); an error's answer is always OpenAI's
`{"error": {...}}` with the status the `ProtocolError` carries.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, TypeVarTuple

import msgspec
import trio
from msgspec import Struct
from quart import Response, current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from trio_llm.http.errors import ProtocolError
from trio_llm.http.wire import decode_request

R = TypeVar("R", bound=Struct)
T = TypeVar("T")
Ts = TypeVarTuple("Ts")

OFF_LOOP_BODY = 1 << 18
"""Bodies from this size on (256 KiB) are decoded and planned on a worker thread: a 16 MB body
of 300,000 short messages takes a second of Python to plan, which on the event loop would stall
every stream."""

JSON_LIMIT_KEY = "TRIO_LLM_MAX_JSON_BODY"
"""The app config key of the largest JSON body (--max-body-size)."""


async def read_body() -> bytes:
    """The request's JSON body: 415 for another content type, 413 past the size limit."""
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ProtocolError(
            415,
            f"Content-Type must be application/json, got {mimetype}",
            code="unsupported_media_type",
        )
    # MAX_CONTENT_LENGTH may be larger, for the audio routes' forms: JSON has its own limit.
    limit = current_app.config.get(JSON_LIMIT_KEY)
    if limit is not None and (request.content_length or 0) > limit:
        raise RequestEntityTooLarge()
    data = await request.get_data(cache=False)  # 413 past MAX_CONTENT_LENGTH
    if limit is not None and len(data) > limit:
        raise RequestEntityTooLarge()
    return data


async def decode_body(kind: type[R], raw: bytes | None = None) -> R:
    """The request's JSON body as a `kind` (`read_body`), or a 400 naming the parameter.
    `raw`: the body, when the caller has read it already (/invocations)."""
    if raw is None:
        raw = await read_body()
    return await by_body_size(len(raw), decode_request, raw, kind)


async def by_body_size(size: int, fn: Callable[[*Ts], T], *args: *Ts) -> T:
    """`fn(*args)`, on a worker thread when it works on a body of `size` bytes from
    `OFF_LOOP_BODY` on (the thread sees the request's context: its contextvars are copied)."""
    if size < OFF_LOOP_BODY:
        return fn(*args)
    return await trio.to_thread.run_sync(fn, *args)


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(payload), status=status, headers=headers, mimetype="application/json"
    )


def error_response(error: ProtocolError) -> Response:
    return json_response(error.to_dict(), error.status, error.headers)
