"""The wire types of the model and tokenization routes: GET /v1/models[/{id}] (OpenAI's),
POST /tokenize and /detokenize (vLLM's, same bodies and answers).

Invariant: nothing here touches Quart or the engine.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET, Struct, UnsetType

from trio_llm.http.conversation import ChatMessage
from trio_llm.http.wire import TokenId


class ModelCard(Struct):
    id: str
    created: int
    max_model_len: int
    object: str = "model"
    owned_by: str = "trio-llm"
    root: str | UnsetType = UNSET
    """A LoRA adapter's directory (vLLM's field)."""
    parent: str | UnsetType = UNSET
    """A LoRA adapter's base model (vLLM's field)."""
    input_modalities: list[str] | UnsetType = UNSET
    """What its requests may hold: ["text"], or ["text", "image"] for a vision-language
    model (the field OpenRouter's model list uses)."""


class ModelList(Struct):
    data: list[ModelCard]
    object: str = "list"


class TokenizeRequest(Struct, kw_only=True):
    """Either `prompt` (plain text) or `messages` (rendered with the chat template)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    """Default: true for a prompt, false for messages (the template adds its own)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


class TokenizeResponse(Struct):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | UnsetType = UNSET


class DetokenizeResponse(Struct):
    prompt: str


WIRE_TYPES: tuple[type[Struct], ...] = (
    ModelList,
    ModelCard,
    TokenizeRequest,
    TokenizeResponse,
    DetokenizeRequest,
    DetokenizeResponse,
)
"""What /openapi.json shows."""
