"""The wire types of POST /v1/embeddings: the request (OpenAI's fields, then vLLM's) and the
list of embeddings it answers with.

Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from trio_llm.http.conversation import ChatMessage
from trio_llm.http.wire import Int32, PositiveInt, RequestId, TokenId


class EmbeddingRequest(Struct, kw_only=True):
    input: str | list[str | TokenId | list[TokenId]] | None = None
    """The texts or token ids to embed; or, instead, `messages`."""
    messages: list[ChatMessage] | None = None
    """vLLM's: one conversation, rendered by the model's chat template and embedded whole."""
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: PositiveInt | None = None
    user: str | None = None
    # vLLM's extensions, same names and meaning.
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    """Cut longer inputs to this many tokens (-1: the model's length) instead of a 400."""
    add_special_tokens: bool | None = None
    """Default: true for `input`, false for `messages` (the template writes them)."""
    add_generation_prompt: bool = False
    """With `messages`: end the rendering with the assistant's turn opened."""
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    priority: Int32 = 0
    request_id: RequestId | None = None


class EmbeddingData(Struct, kw_only=True):
    object: str = "embedding"
    index: int
    embedding: list[float] | str
    """Floats, or with encoding_format base64 the little-endian float32 bytes in base64."""


class EmbeddingUsage(Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct, kw_only=True):
    object: str = "list"
    id: str
    created: int
    model: str
    data: list[EmbeddingData]
    usage: EmbeddingUsage


WIRE_TYPES: tuple[type[Struct], ...] = (EmbeddingRequest, EmbeddingResponse)
"""What /openapi.json shows."""
