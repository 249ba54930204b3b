"""OpenAI response types, response ids, and the bytes of server-sent events.

Owns the shape of what the server answers: complete responses and SSE chunks as msgspec
Structs (from which /openapi.json is generated), and the SSE framing of one event. The builders
that fill these from `RequestOutput`s are in builders.py. Invariant: every byte a client
receives for a completion is one of these types or events, in exactly OpenAI's shape (ids,
object names, choices, finish_reason, usage).
"""

from __future__ import annotations

import hashlib
import time
import uuid
from typing import Any

import msgspec
from msgspec import UNSET, Struct, UnsetType

_encoder = msgspec.json.Encoder()

SSE_DONE = b"data: [DONE]\n\n"


def sse_event(payload: Any) -> bytes:
    """One server-sent event carrying one JSON object. A Struct tagged with its type (the
    Responses API's events) names itself in an `event:` line too, as OpenAI's streams do."""
    data = b"data: " + _encoder.encode(payload) + b"\n\n"
    config = getattr(type(payload), "__struct_config__", None)
    tag = getattr(config, "tag", None)
    if isinstance(tag, str):
        return b"event: " + tag.encode() + b"\n" + data
    return data


def new_response_id(prefix: str, request_id: str | None = None) -> str:
    """`prefix` ends with its separator: `chatcmpl-`, `cmpl-`, `embd-`, `resp_`."""
    return f"{prefix}{request_id or uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def system_fingerprint(*parts: str) -> str:
    """OpenAI's `system_fingerprint`: the same for as long as what decides the outputs (the
    model, its dtype, the server's version) stays the same."""
    return "fp_" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


# ---------------------------------------------------------------------------------------------
# Types


class PromptTokensDetails(Struct):
    cached_tokens: int
    """Prompt tokens served from the prefix cache."""


class Usage(Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct):
    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(name="bytes")


class ChatTokenLogprob(Struct):
    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(name="bytes")
    top_logprobs: list[TopLogprob] = msgspec.field(default_factory=list)


class ChatLogprobs(Struct):
    content: list[ChatTokenLogprob] | None


class PromptLogprob(Struct):
    """vLLM's shape for one candidate at one prompt position (`prompt_logprobs`)."""

    logprob: float
    rank: int | None
    decoded_token: str


PromptLogprobs = list[dict[int, PromptLogprob] | None]
"""Per prompt position, the prompt's own token and the top alternatives, by token id; the
first position is null (no context)."""


class FunctionCallOut(Struct):
    name: str
    arguments: str
    """The arguments object as JSON text."""


class ToolCallOut(Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCallOut


class ChatMessageOut(Struct):
    role: str
    content: str | None
    refusal: None = None
    tool_calls: list[ToolCallOut] | UnsetType = UNSET
    """Present when the answer calls tools."""


class FunctionDeltaOut(Struct, omit_defaults=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDeltaOut(Struct, kw_only=True, omit_defaults=True):
    """A piece of a streamed call: the first carries id, type and the function's name, the
    later ones fragments of its arguments (concatenated, they are the arguments' JSON text)."""

    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionDeltaOut


class ChatChoice(Struct, kw_only=True):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    """vLLM's: the stop string or stop token id that ended the choice (null for EOS)."""
    token_ids: list[int] | UnsetType = UNSET
    """With return_token_ids."""


class ChatCompletionResponse(Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    object: str = "chat.completion"
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET


class ChatDelta(Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDeltaOut] | UnsetType = UNSET


class ChatChunkChoice(Struct, kw_only=True):
    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | UnsetType = UNSET


class ChatCompletionChunk(Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[ChatChunkChoice]
    object: str = "chat.completion.chunk"
    system_fingerprint: str | None = None
    usage: Usage | UnsetType | None = UNSET
    """Present (null until the last chunk) only when stream_options.include_usage is set."""
    prompt_token_ids: list[int] | UnsetType = UNSET
    """With return_token_ids, on the first chunk."""


class CompletionLogprobs(Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(Struct, kw_only=True):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: str | None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobs | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET
    token_ids: list[int] | UnsetType = UNSET


class CompletionResponse(Struct, kw_only=True):
    id: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    object: str = "text_completion"
    system_fingerprint: str | None = None


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "trio-llm"


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


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


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | UnsetType = UNSET


class DetokenizeResponse(Struct):
    prompt: str


RESPONSE_TYPES: tuple[type[Struct], ...] = (
    ChatCompletionResponse,
    ChatCompletionChunk,
    CompletionResponse,
    EmbeddingResponse,
    ModelList,
    ModelCard,
    TokenizeResponse,
    DetokenizeResponse,
)
