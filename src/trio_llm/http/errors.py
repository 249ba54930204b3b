"""The one error type of the HTTP edge, and its OpenAI JSON shape.

Every failure a client can see is a `ProtocolError`: raised where the fault is known (request
validation, admission, a missing key) or translated once from an engine error at the edge. It
carries the HTTP status and OpenAI's `type`, `param` and `code`, so the body is always
`{"error": {"message", "type", "param", "code"}}` and nothing else decides the status.
"""

from __future__ import annotations

from typing import Any

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
    """A standard OpenAI feature this server does not implement yet: a clear 400, never a 500."""
    return ProtocolError(
        400, f"{what} is not supported yet by this server", param=param, code="unsupported"
    )
