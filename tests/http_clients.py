"""Test clients the HTTP tests share: SSE framing checks, a bare HTTP/2 client, and clients
that hang up at a chosen moment (for disconnect tests and bench/serving/soak.py)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import h2.config
import h2.connection
import h2.events
import trio


def sse_payloads(text: str) -> list[str]:
    """The data of each event, checking the framing: `data: ...` lines, blank-line separated."""
    assert text.endswith("\n\n")
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: ") :] for e in events]


class H2Client:
    """A bare HTTP/2 client over a socket: httpx never resets a stream it stops reading, so
    a per-stream abort test has to send RST_STREAM itself."""

    def __init__(self, stream: trio.SocketStream, authority: str) -> None:
        self.stream = stream
        self.authority = authority
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.data: dict[int, bytes] = {}
        self.ended: set[int] = set()

    async def start(self) -> None:
        self.conn.initiate_connection()
        await self.flush()

    async def flush(self) -> None:
        await self.stream.send_all(self.conn.data_to_send())

    async def post(self, path: str, body: dict, headers: dict[str, str]) -> int:
        sid = self.conn.get_next_available_stream_id()
        raw = json.dumps(body).encode()
        self.conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":path", path),
                (":scheme", "http"),
                (":authority", self.authority),
                ("content-type", "application/json"),
                ("content-length", str(len(raw))),
                *headers.items(),
            ],
        )
        self.conn.send_data(sid, raw, end_stream=True)
        await self.flush()
        self.data[sid] = b""
        return sid

    async def reset(self, sid: int) -> None:
        self.conn.reset_stream(sid)
        await self.flush()

    async def receive_until(self, done) -> None:  # type: ignore[no-untyped-def]
        while not done():
            chunk = await self.stream.receive_some(65536)
            assert chunk, "server closed the connection"
            for event in self.conn.receive_data(chunk):
                if isinstance(event, h2.events.DataReceived):
                    self.data[event.stream_id] = self.data.get(event.stream_id, b"") + event.data
                    self.conn.acknowledge_received_data(
                        event.flow_controlled_length, event.stream_id
                    )
                elif isinstance(event, h2.events.StreamEnded):
                    self.ended.add(event.stream_id)
            await self.flush()


# -- clients that hang up ---------------------------------------------------------------------

HANG_UP_MODES = ("before_headers", "first_chunk", "mid_stream", "non_streaming_wait")


@dataclass(frozen=True, slots=True)
class HangUp:
    """When a client hangs up on its request.

    before_headers: `delay` seconds after sending, reading nothing. first_chunk / mid_stream:
    once `events` SSE events have arrived (the body must stream). non_streaming_wait: `delay`
    seconds into the wait for a complete response. complete: never; read the whole response."""

    mode: str
    events: int = 1
    delay: float = 0.0

    def reached(self, received: bytes, started: float) -> bool:
        if self.mode in ("first_chunk", "mid_stream"):
            return received.count(b"data:") >= self.events
        if self.mode == "non_streaming_wait":
            return trio.current_time() - started >= self.delay
        return False


def random_hang_up(rng: random.Random) -> HangUp:
    mode = rng.choice(HANG_UP_MODES)
    if mode == "before_headers":
        return HangUp(mode, delay=rng.choice([0.0, 0.0, 0.002, 0.01, 0.03]))
    if mode == "first_chunk":
        return HangUp(mode, events=1)
    if mode == "mid_stream":
        return HangUp(mode, events=rng.randint(2, 12))
    return HangUp(mode, delay=rng.uniform(0.02, 0.4))


async def http1_request(
    address: tuple[str, int], path: str, body: dict, headers: dict[str, str], hang_up: HangUp
) -> bytes:
    """POST over a fresh HTTP/1.1 connection and close it at the hang-up point (or, for
    `complete`, once the server closes it: the request says `Connection: close`). Returns the
    bytes that arrived."""
    host, port = address
    raw = json.dumps(body).encode()
    lines = [
        f"POST {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Content-Type: application/json",
        f"Content-Length: {len(raw)}",
        "Connection: close",
        *(f"{k}: {v}" for k, v in headers.items()),
    ]
    received = b""
    stream = await trio.open_tcp_stream(host, port)
    try:
        await stream.send_all(("\r\n".join(lines) + "\r\n\r\n").encode() + raw)
        if hang_up.mode == "before_headers":
            await trio.sleep(hang_up.delay)
            return received
        started = trio.current_time()
        limit = hang_up.delay if hang_up.mode == "non_streaming_wait" else 60.0
        with trio.move_on_after(limit) as waited:
            while not hang_up.reached(received, started):
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break  # the response is complete, so the server closed
                received += chunk
        if waited.cancelled_caught and hang_up.mode != "non_streaming_wait":
            raise TimeoutError(f"{hang_up.mode}: nothing for {limit} s after {received[-200:]!r}")
    finally:
        await stream.aclose()
    return received


async def http2_requests(
    address: tuple[str, int],
    requests: list[tuple[str, dict, HangUp]],
    headers: dict[str, str],
    *,
    close_connection: bool = False,
) -> dict[int, bytes]:
    """Several streams on one HTTP/2 connection, each reset (RST_STREAM) at its own hang-up
    point; with `close_connection`, the first hang-up closes the whole connection instead.
    Returns each stream's received data."""
    host, port = address
    client = H2Client(await trio.open_tcp_stream(host, port), f"{host}:{port}")
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        await client.start()
        pending: dict[int, tuple[HangUp, float]] = {}
        for path, body, hang_up in requests:
            sid = await client.post(path, body, lowered)
            pending[sid] = (hang_up, trio.current_time())
        while pending:
            for sid, (hang_up, started) in list(pending.items()):
                due = hang_up.reached(client.data[sid], started) or (
                    hang_up.mode == "before_headers"
                    and trio.current_time() - started >= hang_up.delay
                )
                if sid in client.ended:
                    del pending[sid]
                elif due:
                    if close_connection:
                        return client.data
                    await client.reset(sid)
                    del pending[sid]
            if pending:
                with trio.move_on_after(0.01):
                    await client.receive_until(lambda: False)
        return client.data
    finally:
        await client.stream.aclose()
