"""The one error type of the HTTP edge, its OpenAI JSON shape, and the one translation into it.

Every failure a client can see is a `ProtocolError`: raised where the fault is known (request
validation, admission, a missing key) or translated once, by `translate_error`, from what the
client layer raises (or from Werkzeug's routing errors, by `from_http_exception`). It carries
the HTTP status and OpenAI's `type`, `param` and `code`, so the body is always
`{"error": {"message", "type", "param", "code"}}` and nothing else decides the status. Nothing
here touches Quart: handlers raise, and the app's error handlers and the SSE stream (for an
error after the 200) both call `translate_error`.
"""

from __future__ import annotations

import logging
from typing import Any

from werkzeug.exceptions import HTTPException

from trio_llm.client.errors import (
    ChatTemplateError,
    EngineDeadError,
    EngineRequestError,
    InvalidPromptError,
    LoraError,
    LoraNotFoundError,
    PromptTooLongError,
    UnservableRequestError,
    UnsupportedTaskError,
)
from trio_llm.sampling_params import SamplingParamsError
from trio_llm.speech.audio import AudioError

log = logging.getLogger(__name__)

_TYPE_FOR_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_exceeded",
    500: "server_error",
    503: "server_error",
}


class ProtocolError(Exception):
    """A request the server refuses, with everything the HTTP response needs."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or _TYPE_FOR_STATUS.get(status, "invalid_request_error")
        self.headers = headers or {}

    def to_dict(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def __repr__(self) -> str:
        return f"ProtocolError({self.status}, {self.message!r}, param={self.param!r})"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ProtocolError:
    return ProtocolError(400, message, param=param, code=code)


def not_supported(param: str, what: str) -> ProtocolError:
    """A feature this server does not implement yet: a clear 400 naming the field, never a
    500 and never a silent drop."""
    return ProtocolError(
        400,
        f"{param}: {what} is not supported yet by this server",
        param=param,
        code="unsupported",
    )


def engine_unavailable() -> ProtocolError:
    """The one 503 for "no engine to serve this right now" (starting, restarting, or dead)."""
    return ProtocolError(
        503,
        "The engine is not running (it is starting or restarting); retry later",
        code="engine_unavailable",
        headers={"Retry-After": "2"},
    )


def translate_error(error: BaseException) -> ProtocolError:
    """The one place an exception becomes what the client sees."""
    if isinstance(error, ProtocolError):
        return error
    if isinstance(error, SamplingParamsError):
        return bad_request(str(error), param=error.param)
    if isinstance(error, PromptTooLongError):
        return bad_request(str(error), param=error.param, code="context_length_exceeded")
    if isinstance(error, AudioError):
        return ProtocolError(error.status, str(error), param=error.param)
    if isinstance(error, InvalidPromptError):
        return bad_request(str(error), param=error.param)
    if isinstance(error, ChatTemplateError):
        return bad_request(str(error), param="messages")
    if isinstance(error, LoraNotFoundError):
        return ProtocolError(404, str(error), param="model", code="model_not_found")
    if isinstance(error, LoraError):
        return bad_request(str(error), param="model")
    if isinstance(error, UnsupportedTaskError):
        return bad_request(str(error), param="model", code="wrong_model_task")
    if isinstance(error, EngineDeadError):
        return ProtocolError(500, f"The engine died: {error}", code="engine_dead")
    if isinstance(error, UnservableRequestError):
        return bad_request(str(error), param=error.param, code="unservable_request")
    if isinstance(error, EngineRequestError):
        return ProtocolError(500, f"The engine failed this request: {error}", code="engine_error")
    log.error("unexpected error", exc_info=error)
    return ProtocolError(500, "Internal server error", code="internal_error")


def from_http_exception(
    error: HTTPException, *, method: str, path: str, max_body_size: int | None
) -> ProtocolError:
    """Werkzeug's routing and body-size errors, in OpenAI's shape and with a message that
    names the request."""
    status = error.code or 500
    headers = {}
    if status == 404:
        message = f"Not found: {method} {path}"
    elif status == 405:
        message = f"Method {method} is not allowed on {path}"
        headers = {k: v for k, v in error.get_headers() if k.lower() == "allow"}
    elif status == 413:
        message = f"The request body is larger than the limit of {max_body_size} bytes"
    else:
        message = error.description or error.name
    return ProtocolError(status, message, headers=headers)
