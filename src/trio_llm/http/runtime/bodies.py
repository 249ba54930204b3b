"""The bodies of a request and its answer, as every handler reads and writes them: the JSON
body in (`read_body`, `decode_body`), JSON out (`json_response`, `error_response`).

Invariant: a body that is not JSON is a 415, one past the size limit a 413, one that does not
decode a 400 naming the parameter (http/wire.py); an error's answer is always OpenAI's
`{"error": {...}}` with the status the `ProtocolError` carries.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from msgspec import Struct
from quart import Response, request

from trio_llm.http.errors import ProtocolError
from trio_llm.http.wire import decode_request

R = TypeVar("R", bound=Struct)


async def read_body() -> bytes:
    """The request's JSON body: 415 for another content type, 413 past the size limit."""
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise ProtocolError(
            415,
            f"Content-Type must be application/json, got {mimetype}",
            code="unsupported_media_type",
        )
    return await request.get_data(cache=False)  # 413 past MAX_CONTENT_LENGTH


async def decode_body(kind: type[R], raw: bytes | None = None) -> R:
    """The request's JSON body as a `kind` (`read_body`), or a 400 naming the parameter.
    `raw`: the body, when the caller has read it already (/invocations)."""
    return decode_request(await read_body() if raw is None else raw, kind)


def json_response(
    payload: Any, status: int = 200, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        msgspec.json.encode(payload), status=status, headers=headers, mimetype="application/json"
    )


def error_response(error: ProtocolError) -> Response:
    return json_response(error.to_dict(), error.status, error.headers)
