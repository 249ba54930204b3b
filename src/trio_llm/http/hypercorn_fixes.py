"""Fixes to Hypercorn (0.18) that a server facing arbitrary HTTP/2 clients needs, installed by
`apply()` where a server starts: `trio-llm serve` before anything else, and every app's
lifespan startup (so `hypercorn 'trio_llm.http:create_app()'` gets them too), never when an app
is merely built. Each was found by the disconnect-storm test (tests/reliability), which fails
without it.

1. A client that closes an HTTP/2 connection at the wrong moment stopped the whole server.
   When a write fails, Hypercorn closes every stream of the connection, even in the middle of
   handling a batch of frames; the next frame of the batch for one of those streams then
   raises KeyError (pgjones/hypercorn#329, also reachable with DATA for a stream the app has
   already answered). Here, once the connection is closed, the rest of the batch is dropped,
   and DATA for a stream that is gone is only acknowledged (so the connection's flow-control
   window stays open).
2. Under Trio, Hypercorn runs every connection's handler in the server's own nursery, so any
   exception escaping one connection stops the server. Here it is logged and ends that
   connection only (Hypercorn's handler closes its socket on the way out), as Hypercorn's
   asyncio worker does. Cancellation still propagates.
3. Connection teardown runs in whatever task reaches it, often an app task that the teardown
   itself cancels (telling a stream's app `http.disconnect` makes Quart-Trio cancel that app's
   task group). A closed HTTP/2 connection then stopped telling its other streams, whose apps
   never learned that the client was gone (their engine requests ran on, the socket stayed
   open); and an HTTP/1.1 connection that must close after its response (the client sent
   `Connection: close`) was never closed, since the close was cancelled between
   `send_eof()` and `aclose()`. Here both are shielded from cancellation. Neither can block:
   each stream's app reads its messages until it gets `http.disconnect`, and closing a socket
   does not wait for the peer.

The fixes replace Hypercorn's own methods, private ones among them, and assume their bodies.
So they are applied only to the versions they were written against and tested on (`SUPPORTED`,
kept in step with pyproject.toml); any other version is refused with
`UnsupportedHypercornError` rather than patched blindly.

Invariant: installed at most once per process; nothing changes for a well-behaved connection.
"""

from __future__ import annotations

import importlib.metadata
import logging

import h2.events
import trio
from hypercorn.events import Closed, Event
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger("trio_llm.http")

SUPPORTED = ((0, 18), (0, 19))
"""Hypercorn releases from the first up to (not including) the second: 0.18.x."""

_applied = False


class UnsupportedHypercornError(RuntimeError):
    """The installed Hypercorn is not one the fixes were tested on."""


def check_version(version: str) -> None:
    """Raise `UnsupportedHypercornError` unless `version` is in `SUPPORTED`."""
    low, high = SUPPORTED
    try:
        release = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        release = None
    if release is None or not low <= release < high:
        wanted = f"hypercorn>={low[0]}.{low[1]},<{high[0]}.{high[1]}"
        raise UnsupportedHypercornError(
            f"Hypercorn {version} is installed, but trio-llm's fixes to Hypercorn "
            f"(trio_llm/http/hypercorn_fixes.py) were written for and tested on {wanted}; "
            f"install that (pip install '{wanted}')"
        )


def _installed_version() -> str:
    return importlib.metadata.version("hypercorn")


def applied() -> bool:
    return _applied


def apply() -> None:
    """Install the fixes (once per process), or raise `UnsupportedHypercornError`."""
    global _applied
    if _applied:
        return
    check_version(_installed_version())
    _applied = True
    handle = H2Protocol.handle
    handle_events = H2Protocol._handle_events
    run = TCPServer.run
    close = TCPServer._close

    async def handle_shielding_close(self: H2Protocol, event: Event) -> None:
        if isinstance(event, Closed):
            with trio.CancelScope(shield=True):
                await handle(self, event)
        else:
            await handle(self, event)

    async def handle_events_while_open(self: H2Protocol, events: list[h2.events.Event]) -> None:
        for event in events:
            if self.closed:
                return  # the connection broke while handling an earlier frame
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                self.connection.acknowledge_received_data(
                    event.flow_controlled_length, event.stream_id
                )
                continue
            await handle_events(self, [event])

    async def close_shielded(self: TCPServer) -> None:
        with trio.CancelScope(shield=True):
            await close(self)

    async def run_one_connection(self: TCPServer) -> None:
        try:
            await run(self)
        except* Exception as group:
            log.error("an HTTP connection failed; closed it", exc_info=group)

    H2Protocol.handle = handle_shielding_close  # type: ignore[method-assign]
    H2Protocol._handle_events = handle_events_while_open  # type: ignore[method-assign]
    TCPServer.run = run_one_connection  # type: ignore[method-assign]
    TCPServer._close = close_shielded  # type: ignore[method-assign]
