"""The wire types of POST /v1/chat/completions: the request (its tools and tool choice), the
complete chat.completion and the chat.completion.chunk of a stream.

The conversation's message types are http/conversation.py's (/tokenize takes them too), the
sampling fields http/sampling.py's, the logprobs and usage http/logprobs.py's and usage.py's.
Invariant: nothing here touches Quart or the engine; every byte a client receives for a chat
completion is one of these types, in exactly OpenAI's shape.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

from trio_llm.http.conversation import ChatMessage
from trio_llm.http.logprobs import ChatLogprobs, PromptLogprobs
from trio_llm.http.sampling import SamplingFields
from trio_llm.http.usage import Usage
from trio_llm.http.wire import FunctionName, PositiveInt, TopLogprobs

# ---------------------------------------------------------------------------------------------
# Request


class FunctionDefinition(Struct, kw_only=True):
    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments object; None: no arguments."""
    strict: bool | None = None
    """Accepted; a forced call's arguments always match the schema."""


class ChatTool(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition


class ToolChoiceFunction(Struct, kw_only=True):
    name: FunctionName


class NamedToolChoice(Struct, kw_only=True):
    """`tool_choice` naming the one function the model must call."""

    type: Literal["function"]
    function: ToolChoiceFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool = False
    top_logprobs: TopLogprobs | None = None
    echo: bool = False
    """vLLM's: the answer starts with the last message's content when that message is the
    assistant's (with continue_final_message, the text the model continues)."""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    """Special tokens (BOS) on top of what the chat template writes."""
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[ChatTool] | None = None
    tool_choice: ToolChoice | None = None
    """Default: `auto` with tools, `none` without."""
    parallel_tool_calls: bool | None = None
    """False: at most one call per answer (default: as many as the model writes)."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    """`none` turns a thinking model's thinking off, any other level on, where its template
    has the switch (`enable_thinking`); a template that reads `reasoning_effort` gets it."""
    thinking_token_budget: PositiveInt | None = None
    """vLLM's: at most this many tokens of thinking, then the closing tag is forced."""
    include_reasoning: bool = True
    """vLLM's: false leaves the thinking out of the response (it is still split off)."""


# ---------------------------------------------------------------------------------------------
# Response


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
    reasoning_content: str | UnsetType | None = UNSET
    """A thinking model's thinking (null: it did not think); present when the model's thinking
    is split out (--reasoning-parser)."""
    reasoning: str | UnsetType | None = UNSET
    """The same, under vLLM's newer name."""


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
    service_tier: str | None = None
    """OpenAI's (always null here), present as its SDK's model has it."""
    system_fingerprint: str | None = None
    prompt_logprobs: PromptLogprobs | None = None
    """vLLM's: always present (null unless asked for), as its clients read it."""
    prompt_token_ids: list[int] | UnsetType = UNSET


class ChatDelta(Struct):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDeltaOut] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET


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


WIRE_TYPES: tuple[type[Struct], ...] = (
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionChunk,
)
"""What /openapi.json shows."""
