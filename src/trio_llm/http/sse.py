"""The bytes of server-sent events: one event carrying one JSON object, and the stream's end.

Invariant: every event is `data: <json>\n\n`, preceded by an `event: <type>` line when the
payload is a Struct tagged with its type (the Responses API's events), as OpenAI's streams are.
"""

from __future__ import annotations

from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()

SSE_DONE = b"data: [DONE]\n\n"
"""What closes a chat or text completion stream."""


def sse_event(payload: Any) -> bytes:
    """One server-sent event carrying one JSON object. A Struct tagged with its type (the
    Responses API's events) names itself in an `event:` line too, as OpenAI's streams do."""
    data = b"data: " + _encoder.encode(payload) + b"\n\n"
    config = getattr(type(payload), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    if isinstance(tag, str):
        return b"event: " + tag.encode() + b"\n" + data
    return data
