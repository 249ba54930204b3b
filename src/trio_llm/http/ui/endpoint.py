"""The chat page: GET / and its assets under /ui/, static files shipped in the package
(beside this module), with no build step and nothing fetched from elsewhere.

The page is a client of the public API only (/v1/models, /v1/chat/completions with SSE); it
holds nothing secret, so it is served without the API key (see runtime/middleware.py), and
every call it makes carries the key the person typed. `--no-ui` makes these routes 404.

Invariant: only the files named in `_ASSETS` are ever served, so no path reaches the disk.
"""

from __future__ import annotations

import functools
from importlib import resources

from quart import Response
from werkzeug.exceptions import NotFound

from trio_llm.http.runtime.state import current_state

_ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "chat.css": "text/css; charset=utf-8",
    "chat.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
}
# The page's own files and the server's API only; model text can never load or run anything.
_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@functools.cache
def _read(name: str) -> bytes:
    return (resources.files(__package__) / name).read_bytes()


def _serve(name: str) -> Response:
    if not current_state().config.ui or name not in _ASSETS:
        raise NotFound()
    return Response(
        _read(name),
        content_type=_ASSETS[name],
        headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": _POLICY,
            "X-Content-Type-Options": "nosniff",
        },
    )


async def chat_page() -> Response:
    return _serve("index.html")


async def asset(name: str) -> Response:
    return _serve(name)
