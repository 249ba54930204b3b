"""Ollama's API on the wire (/api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags,
/api/show, /api/ps, /api/version): the requests, the objects the server answers (one, or one a
line when streaming), and Ollama's error object.

Owns what a body may contain, in Ollama's shape: `stream` is true unless the body says false
(Ollama's default, unlike OpenAI's); a tool call's `arguments` is a JSON object, not text;
`options` is decoded as its known fields (typed, so a wrong type is a 400 naming
`options.<name>`), and options.py decides what each means here. Fields this server cannot
honour (images, a Go `template`, `suffix`) decode, so that the plan refuses them with a 400
naming them. Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from trio_llm.http.errors import ProtocolError
from trio_llm.http.wire import Int32, Int64, PositiveInt, TokenId, TopLogprobs

# ---------------------------------------------------------------------------------------------
# Requests


class Options(Struct, kw_only=True):
    """Ollama's `options` (its Modelfile parameters). options.py maps, ignores or refuses
    each; a key not listed here is ignored, as Ollama ignores it."""

    # Load-time and runtime settings: they change how fast, not what.
    numa: bool | None = None
    num_ctx: Int32 | None = None
    num_batch: int | None = None
    num_gpu: int | None = None
    main_gpu: int | None = None
    low_vram: bool | None = None
    f16_kv: bool | None = None
    logits_all: bool | None = None
    vocab_only: bool | None = None
    use_mmap: bool | None = None
    use_mlock: bool | None = None
    embedding_only: bool | None = None
    num_thread: int | None = None
    num_keep: int | None = None
    # Sampling.
    seed: Int64 | None = None
    num_predict: Int32 | None = None
    top_k: Int32 | None = None
    top_p: float | None = None
    min_p: float | None = None
    typical_p: float | None = None
    tfs_z: float | None = None
    repeat_last_n: Int32 | None = None
    temperature: float | None = None
    repeat_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    mirostat: Int32 | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    penalize_newline: bool | None = None
    stop: list[str] | str | None = None


class ToolCallFunctionIn(Struct, kw_only=True):
    name: str
    arguments: dict[str, Any] | str = {}
    """An object (Ollama's); JSON text is accepted too (what OpenAI-minded clients send)."""
    index: int | None = None


class OllamaToolCall(Struct, kw_only=True):
    function: ToolCallFunctionIn
    id: str | None = None
    type: str | None = None


class OllamaMessage(Struct, kw_only=True):
    role: str
    content: str | None = None
    thinking: str | None = None
    """An earlier answer's thinking: dropped, as chat templates drop it."""
    images: list[str] | None = None
    tool_calls: list[OllamaToolCall] | None = None
    tool_name: str | None = None
    """A tool message's: the tool that answered."""
    tool_call_id: str | None = None


class FunctionIn(Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class OllamaTool(Struct, kw_only=True):
    type: str = "function"
    function: FunctionIn


Format = Literal["", "json"] | dict[str, Any] | None
Think = bool | Literal["low", "medium", "high"] | None
KeepAlive = float | str | None


class _Generating(Struct, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: str
    stream: bool = True
    """Ollama streams unless told not to."""
    format: Format = None
    options: Options | None = None
    keep_alive: KeepAlive = None
    """Accepted: models stay loaded for as long as the server runs."""
    think: Think = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    """Alternatives per position (0-20), with logprobs."""

    # What the generate skeleton reads of every request (generate/endpoint.py).
    @property
    def request_id(self) -> str | None:
        return None

    @property
    def priority(self) -> int:
        return 0


class ChatRequest(_Generating, kw_only=True):
    messages: list[OllamaMessage] = []
    tools: list[OllamaTool] | None = None


class GenerateRequest(_Generating, kw_only=True):
    prompt: str = ""
    system: str | None = None
    template: str | None = None
    raw: bool = False
    suffix: str | None = None
    context: list[TokenId] | None = None
    images: list[str] | None = None


class EmbedRequest(Struct, kw_only=True):
    model: str
    input: str | list[str]
    truncate: bool = True
    """Ollama's default: inputs past the context are cut to fit rather than refused."""
    dimensions: PositiveInt | None = None
    options: Options | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(Struct, kw_only=True):
    """The legacy /api/embeddings."""

    model: str
    prompt: str = ""
    options: Options | None = None
    keep_alive: KeepAlive = None


class ModelRequest(Struct, kw_only=True):
    """/api/show, /api/pull, /api/delete, ...: one model, named as `model` (or the older
    `name`)."""

    model: str | None = None
    name: str | None = None
    verbose: bool = False
    stream: bool = True

    @property
    def model_name(self) -> str:
        return self.model or self.name or ""


# ---------------------------------------------------------------------------------------------
# Responses


class ToolCallFunctionOut(Struct, kw_only=True):
    name: str
    arguments: dict[str, Any]
    index: int = 0


class OllamaToolCallOut(Struct, kw_only=True):
    id: str
    function: ToolCallFunctionOut


class MessageOut(Struct, kw_only=True, omit_defaults=True):
    """`role` and `content` always go out (Ollama's clients require the role)."""

    role: str
    content: str
    thinking: str | None = None
    tool_calls: list[OllamaToolCallOut] | None = None


class TokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float


class Logprob(Struct, kw_only=True, omit_defaults=True):
    """One generated token's: its log probability and the most likely alternatives."""

    token: str
    logprob: float
    top_logprobs: list[TokenLogprob] | None = None


class Timings(Struct, kw_only=True):
    """The final object's counts and durations (nanoseconds)."""

    total_duration: int
    load_duration: int
    prompt_eval_count: int
    prompt_eval_duration: int
    eval_count: int
    eval_duration: int


class _Chunk(Struct, kw_only=True, omit_defaults=True):
    """What every object of /api/chat and /api/generate carries; the last (done) adds the
    reason, the counts and the durations (`Timings`)."""

    model: str
    created_at: str
    done: bool
    done_reason: str | None = None
    logprobs: list[Logprob] | None = None
    total_duration: int | None = None
    load_duration: int | None = None
    prompt_eval_count: int | None = None
    prompt_eval_duration: int | None = None
    eval_count: int | None = None
    eval_duration: int | None = None


class ChatChunk(_Chunk, kw_only=True, omit_defaults=True):
    """One object of /api/chat: a piece of the answer, or (done) the whole or the last."""

    message: MessageOut


class GenerateChunk(_Chunk, kw_only=True, omit_defaults=True):
    response: str
    thinking: str | None = None
    context: list[int] | None = None
    """The last object's: the prompt's and the answer's token ids."""


class EmbedResponse(Struct, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingsResponse(Struct):
    embedding: list[float]


class Details(Struct, kw_only=True, omit_defaults=True):
    parent_model: str = ""
    format: str = ""
    family: str = ""
    families: list[str] | None = None
    parameter_size: str = ""
    quantization_level: str = ""


class ListedModel(Struct, kw_only=True):
    """One model of /api/tags."""

    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class RunningModel(Struct, kw_only=True):
    """One model of /api/ps."""

    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int


class Tags(Struct):
    """/api/tags: the served models."""

    models: list[ListedModel]


class Running(Struct):
    """/api/ps: the served models with a live engine."""

    models: list[RunningModel]


class ShowResponse(Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Status(Struct):
    """What /api/pull answers for a model already served."""

    status: str


class Version(Struct):
    version: str
    """The version of Ollama's API this server speaks (clients gate features on it)."""
    trio_llm: str


class ErrorLine(Struct):
    """Ollama's error object: a response's whole body, or a line of a failed stream."""

    error: str


def error_body(error: ProtocolError) -> bytes:
    return msgspec.json.encode(ErrorLine(error.message))


WIRE_TYPES: tuple[type[Struct], ...] = (
    ChatRequest,
    ChatChunk,
    GenerateRequest,
    GenerateChunk,
    EmbedRequest,
    EmbedResponse,
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelRequest,
    Tags,
    Running,
    ShowResponse,
    Status,
    Version,
    ErrorLine,
)
"""What /openapi.json shows."""
