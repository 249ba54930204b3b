"""Test clients the HTTP tests share: SSE framing checks and a bare HTTP/2 client."""

from __future__ import annotations

import json

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
