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
   and DATA for a stream that is gone is only acknowledged, and the window updates sent (so
   the flow-control windows stay open: a client still sending the body of a request answered
   early, a 413, finishes sending and reads the answer, instead of waiting for ever).
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
from collections.abc import Awaitable, Callable

import h2.errors
import h2.events
import h11
import trio
from hypercorn.events import Closed, Event, Updated
from hypercorn.protocol.events import Body, EndBody
from hypercorn.protocol.events import Event as StreamEvent
from hypercorn.protocol.h2 import H2Protocol
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.trio.tcp_server import TCPServer

log = logging.getLogger("trio_llm.http")

SUPPORTED = ((0, 18), (0, 19))
"""Hypercorn releases from the first up to (not including) the second: 0.18.x."""

DRAIN_LIMIT = 1 << 30
"""Bytes of an answered request's body read and dropped before the connection (HTTP/1.1) or
the stream (HTTP/2, RST_STREAM NO_ERROR) is closed instead."""

_applied = False


class _Drain:
    """An HTTP/1.1 request's stream once its response is out: what is left of its body is
    dropped, then the connection is recycled (or closed past `DRAIN_LIMIT`)."""

    def __init__(
        self, protocol: H11Protocol, recycle: Callable[[H11Protocol], Awaitable[None]]
    ) -> None:
        self.protocol = protocol
        self.recycle = recycle
        self.left = DRAIN_LIMIT

    async def handle(self, event: StreamEvent) -> None:
        if isinstance(event, Body):
            self.left -= len(event.data)
            if self.left < 0:
                self.protocol.stream = None
                await self.protocol.send(Closed())
        elif isinstance(event, EndBody):
            self.protocol.stream = None
            await self.recycle(self.protocol)


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
    recycle = H11Protocol._maybe_recycle

    async def handle_shielding_close(self: H2Protocol, event: Event) -> None:
        if isinstance(event, Closed):
            with trio.CancelScope(shield=True):
                await handle(self, event)
        else:
            await handle(self, event)

    async def handle_events_while_open(self: H2Protocol, events: list[h2.events.Event]) -> None:
        draining: dict[int, int] = self.__dict__.setdefault("_trio_llm_draining", {})
        acknowledged = False
        for event in events:
            if self.closed:
                return  # the connection broke while handling an earlier frame
            stream_id = getattr(event, "stream_id", None)
            if isinstance(event, h2.events.DataReceived) and stream_id not in self.streams:
                # The body of a request answered already (a 413): acknowledged, and counted.
                self.connection.acknowledge_received_data(event.flow_controlled_length, stream_id)
                acknowledged = True
                drained = draining.get(stream_id, 0) + event.flow_controlled_length
                if drained > DRAIN_LIMIT:
                    self.connection.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
                    del draining[stream_id]
                else:
                    draining[stream_id] = drained
                    await self.send(Updated(idle=False))  # not idle while a client still sends
                continue
            ended = isinstance(event, h2.events.StreamEnded | h2.events.StreamReset)
            if ended and draining.pop(stream_id, None) is not None and not self.streams:
                await self.send(Updated(idle=True))
            await handle_events(self, [event])
        if acknowledged:
            await self._flush()  # the window updates, which Hypercorn flushes only after events

    async def recycle_after_the_body(self: H11Protocol) -> None:
        if (
            self.connection.our_state is h11.DONE
            and self.connection.their_state is h11.SEND_BODY
            and not self.connection.they_are_waiting_for_100_continue
            and not self.context.terminated.is_set()
        ):
            # Answered before its body was read whole (a 413): read the rest and drop it
            # before the connection is recycled or closed.
            await self._close_stream()
            self.stream = _Drain(self, recycle)
            await self.can_read.set()
            return
        await recycle(self)

    async def close_shielded(self: TCPServer) -> None:
        with trio.CancelScope(shield=True):
            await close(self)

    async def run_one_connection(self: TCPServer) -> None:
        try:
            await run(self)
        except* Exception as group:
            log.error("an HTTP connection failed; closed it", exc_info=group)

    H11Protocol._maybe_recycle = recycle_after_the_body  # type: ignore[method-assign]
    H2Protocol.handle = handle_shielding_close  # type: ignore[method-assign]
    H2Protocol._handle_events = handle_events_while_open  # type: ignore[method-assign]
    TCPServer.run = run_one_connection  # type: ignore[method-assign]
    TCPServer._close = close_shielded  # type: ignore[method-assign]
