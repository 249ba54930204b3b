"""The ids and stamps of a response: its id, the engine requests' ids, its creation time,
OpenAI's `system_fingerprint`, and the `ResponseHead` that carries them to the builders.

Invariant: engine request ids are unique even when clients reuse a `request_id`.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What every response and chunk of one request repeats."""

    response_id: str
    model: str
    created: int
    system_fingerprint: str | None = None


def new_response_id(prefix: str, request_id: str | None = None) -> str:
    """`prefix` ends with its separator: `chatcmpl-`, `cmpl-`, `embd-`, `resp_`."""
    return f"{prefix}{request_id or uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def system_fingerprint(*parts: str) -> str:
    """OpenAI's `system_fingerprint`: the same for as long as what decides the outputs (the
    model, its dtype, the server's version) stays the same."""
    return "fp_" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


def engine_request_ids(response_id: str, count: int, user_given: bool) -> list[str]:
    """Engine ids must be unique even when clients reuse a request_id."""
    suffix = f"-{uuid.uuid4().hex[:8]}" if user_given else ""
    if count == 1:
        return [response_id + suffix]
    return [f"{response_id}-{i}{suffix}" for i in range(count)]
