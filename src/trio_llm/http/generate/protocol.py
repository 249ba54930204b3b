"""The wire type the generate skeleton answers with itself: a rendered request (vLLM's render
routes), shared by chat and completions."""

from __future__ import annotations

from typing import Any

from msgspec import Struct


class RenderedPrompt(Struct, omit_defaults=True):
    """vLLM's render routes' answer (its token-in, token-out `GenerateRequest`): what a request
    would send the engine. Routers (vllm-router, llm-d) ask for it to learn a chat request's
    token ids for cache-aware routing without generating."""

    request_id: str
    token_ids: list[int]
    model: str
    sampling_params: dict[str, Any]
    stream: bool = False
    cache_salt: str | None = None
    priority: int = 0


WIRE_TYPES = (RenderedPrompt,)
