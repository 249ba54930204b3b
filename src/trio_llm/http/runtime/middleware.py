"""What runs around every route: the per-request cleanup stack, CORS, the API key, the
request counter, and the `X-Request-Id` echo.

Invariants:
- A request's cleanups (`on_request_end`) run when its ASGI call ends, which is the only point
  that comes after both the handler and the response body, whatever happened: a handler that
  raised, a stream the client dropped, a body never started.
- With an API key, every route under `/v1/`, `/api/` (Ollama's), `/tokenize`, `/detokenize`
  and `/invocations` needs it (all routes with `protect_all_routes`); CORS preflights
  (OPTIONS) and the chat page's static files never do (a browser cannot send the key when it
  opens a page; the page sends it on its API calls).
- The key is read from `Authorization: Bearer <key>` (OpenAI's SDKs) or `x-api-key: <key>`
  (Anthropic's), whichever the client sends. Several keys may be configured, each with roles
  (api_keys.py); the roles of the key a request sent are in its scope for `check_priority`,
  which every endpoint that takes a `priority` calls (none on a server without keys: all).
- CORS, when origins are configured, allows any header a preflight asks for: the openai-node
  SDK sends its own (`X-Stainless-*`), and the API key decides who may call, not CORS.
- A request's `X-Request-Id` (a router's or a proxy's id) is echoed on its response and, when
  it is a valid id and the body names none, becomes the response's id (`header_request_id`),
  so one id follows the request through the router's logs and this server's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from trio_llm.http.api_keys import ALL_ROLES
from trio_llm.http.api_keys import check_priority as check_roles_priority
from trio_llm.http.config import ServerConfig
from trio_llm.http.errors import ProtocolError
from trio_llm.http.runtime.metrics import Metrics

_CLEANUP = "trio_llm.cleanup"
_ROLES = "trio_llm.roles"
"""The roles of the key the request sent (api_keys.py), set before any handler runs."""
_PROTECTED_PREFIXES = ("/v1/", "/api/", "/tokenize", "/detokenize", "/invocations")
REQUEST_ID_HEADER = "X-Request-Id"
_VALID_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


class _CleanupMiddleware:
    """Gives each HTTP request an ExitStack that closes when its ASGI call ends."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with ExitStack() as stack:
            scope[_CLEANUP] = stack
            await self.app(scope, receive, send)


def on_request_end(callback: Callable[[], object]) -> None:
    """Call `callback` when the current request's ASGI call ends, however it ends."""
    request.scope[_CLEANUP].callback(callback)


def check_priority(priority: int) -> None:
    """A 403 naming `priority` unless the current request's key may ask for `priority` (a
    request that never met the middleware has no role)."""
    check_roles_priority(priority, request.scope.get(_ROLES, frozenset()))


def cleanup_scope(stack: ExitStack) -> dict[str, Any]:
    """The scope entry of a request made in-process (a batch's line, http/batch/lines.py):
    its `on_request_end` callbacks run when `stack` closes."""
    return {_CLEANUP: stack}


def header_request_id() -> str | None:
    """The current request's `X-Request-Id`, if it is usable as an id (what `request_id`
    accepts in a body); None otherwise."""
    given = request.headers.get(REQUEST_ID_HEADER)
    if given is None or not _VALID_REQUEST_ID.match(given):
        return None
    return given


def install_middleware(app: QuartTrio, config: ServerConfig, metrics: Metrics) -> QuartTrio:
    """Wrap `app` in the cleanup stack, CORS (when origins are configured), authentication and
    request counting; returns the app to register routes on."""
    app.asgi_app = _CleanupMiddleware(app.asgi_app)  # type: ignore[method-assign]
    if config.allowed_origins:
        from quart_cors import cors

        origins = list(config.allowed_origins)
        app = cors(
            app,
            allow_origin="*" if "*" in origins else origins,
            allow_headers=["*"],
            allow_methods=["GET", "POST", "OPTIONS"],
        )
    keys = config.api_keys

    @app.before_request
    async def authenticate() -> None:
        if keys is None:
            request.scope[_ROLES] = ALL_ROLES  # no keys, no tenants
            return
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        given = [token.strip()] if scheme.lower() == "bearer" else []
        given += request.headers.getlist("x-api-key")
        roles = keys.roles_of(given)
        request.scope[_ROLES] = roles or frozenset()
        if request.method == "OPTIONS":
            return
        path = request.path
        if not config.protect_all_routes and not path.startswith(_PROTECTED_PREFIXES):
            return
        if path == "/" or path.startswith("/ui/"):
            return
        if roles is None:
            raise ProtocolError(
                401,
                "Missing or incorrect API key: send it as `Authorization: Bearer <key>` "
                "or `x-api-key: <key>`",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )

    @app.after_request
    async def count_request(response: Response) -> Response:
        rule = request.url_rule
        metrics.http_requests.labels(
            request.method, rule.rule if rule is not None else "unmatched", response.status_code
        ).inc()
        given = request.headers.get(REQUEST_ID_HEADER)
        if given is not None and REQUEST_ID_HEADER not in response.headers:
            response.headers[REQUEST_ID_HEADER] = given
        return response

    return app
