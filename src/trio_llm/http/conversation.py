"""A chat conversation: its messages on the wire, and the messages a chat template renders.

Shared by /v1/chat/completions and /tokenize (which render the same `messages`); the Responses
API builds the same rendered shape from its items (responses/plan.py). Owns the message and
content-part wire types, the conversation's shape checks (roles, tool calls and results, no
legacy function messages, text-only content), and the `chat_template_kwargs` a request may not
set. `Conversation` is what an endpoint's plan asks of the prompt (generate/prompt.py renders
it): chat, the Responses API and the Messages API each build one. Invariant: every malformed
conversation ends in a `ProtocolError` naming where it is, and nothing here touches Quart or
the engine; tool calls and results are rendered for the template by http/tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from trio_llm.constraint import Constraint
from trio_llm.http.errors import bad_request, not_supported
from trio_llm.http.tools import FunctionTool, NamedFunction, ToolChoiceValue

# ---------------------------------------------------------------------------------------------
# On the wire


class TextPart(Struct, tag="text", tag_field="type"):
    text: str


class ImageUrlPart(Struct, tag="image_url", tag_field="type"):
    image_url: dict[str, Any] | str


class InputAudioPart(Struct, tag="input_audio", tag_field="type"):
    input_audio: dict[str, Any]


class RefusalPart(Struct, tag="refusal", tag_field="type"):
    refusal: str


class VideoUrlPart(Struct, tag="video_url", tag_field="type"):
    video_url: dict[str, Any] | str


class FilePart(Struct, tag="file", tag_field="type"):
    file: dict[str, Any]


ContentPart = TextPart | ImageUrlPart | InputAudioPart | RefusalPart | VideoUrlPart | FilePart


class ToolCallFunction(Struct, kw_only=True):
    name: str
    arguments: str
    """The arguments object as JSON text, as the server returned it."""


class ToolCallIn(Struct, kw_only=True):
    """An assistant message's earlier call, in a conversation's history."""

    id: str
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(Struct, kw_only=True):
    role: Annotated[str, Meta(min_length=1, max_length=64)]
    """Any role the chat template understands (vLLM passes custom roles to the template);
    `developer` is rendered as `system`."""
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    """An assistant message's calls (its content may then be null)."""
    tool_call_id: str | None = None
    """A `tool` message's: the call it answers."""


# ---------------------------------------------------------------------------------------------
# For the template


IMAGE_MARKER = "<|trio-llm-image|>"
"""Where a picture was in a message's text, until the model's own image token replaces it
(generate/prompt.py): the plan does not know the model."""


@dataclass(frozen=True, slots=True)
class ImageRef:
    """A picture of the conversation, in order: its URL and the field that named it."""

    url: str
    param: str
    """e.g. messages[1].content[0].image_url: what an error about it names."""


def image_url_of(part: ImageUrlPart, param: str) -> str:
    url = part.image_url if isinstance(part.image_url, str) else part.image_url.get("url")
    if not isinstance(url, str) or not url:
        raise bad_request(f"{param}.url is required", param=f"{param}.url")
    return url


def chat_messages(
    messages: list[ChatMessage], param: str = "messages", images: list[ImageRef] | None = None
) -> list[dict[str, Any]]:
    """The conversation as the chat template wants it: role and plain-text content, with an
    assistant's `tool_calls` and a tool message's `tool_call_id` in OpenAI's chat shape
    (http/tools renders them for the template). With `images`, an image part becomes
    IMAGE_MARKER in its message's text and its URL is appended there; without, it is a 400."""
    if not messages:
        raise bad_request(f"{param} must contain at least one message", param=param)
    rendered: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"{param}[{i}]"
        if message.role == "function":
            raise not_supported(where, "Function messages (the legacy functions; use tools)")
        content = message.content
        if content is None and not message.tool_calls:
            raise bad_request(f"{where}.content is required", param=f"{where}.content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if isinstance(part, TextPart):
                    texts.append(part.text)
                elif isinstance(part, RefusalPart):
                    texts.append(part.refusal)
                elif isinstance(part, ImageUrlPart) and images is not None:
                    where_part = f"{where}.content[{j}].image_url"
                    images.append(ImageRef(image_url_of(part, where_part), where_part))
                    texts.append(IMAGE_MARKER)
                else:
                    raise not_supported(f"{where}.content[{j}]", "Image and audio content")
            content = "\n".join(texts)
        role = "system" if message.role == "developer" else message.role
        out: dict[str, Any] = {"role": role, "content": content or ""}
        if message.tool_calls:
            if role != "assistant":
                raise bad_request(
                    f"{where}.tool_calls: only an assistant message makes calls",
                    param=f"{where}.tool_calls",
                )
            out["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.function.name, "arguments": call.function.arguments},
                }
                for call in message.tool_calls
            ]
        if role == "tool":
            if message.tool_call_id is None:
                raise bad_request(
                    f"{where}.tool_call_id is required in a tool message",
                    param=f"{where}.tool_call_id",
                )
            out["tool_call_id"] = message.tool_call_id
        if message.name is not None and role == "tool":
            out["name"] = message.name
        rendered.append(out)
    return rendered


def uses_tools(messages: list[dict[str, Any]]) -> bool:
    """Whether the conversation holds calls or their results (rendered by http/tools)."""
    return any(m.get("tool_calls") or m["role"] == "tool" for m in messages)


_RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""Arguments of `apply_chat_template` that the server sets itself."""


def check_template_kwargs(kwargs: dict[str, Any] | None) -> None:
    for key in kwargs or ():
        if key in _RESERVED_TEMPLATE_KWARGS:
            raise bad_request(
                f"chat_template_kwargs may not set {key!r}", param="chat_template_kwargs"
            )


@dataclass(frozen=True, slots=True)
class Conversation:
    """What an endpoint's plan asks of the prompt."""

    messages: list[dict[str, Any]]
    """In OpenAI's chat shape (what http/tools renders)."""
    tools: list[FunctionTool] = field(default_factory=list)
    tool_choice: ToolChoiceValue | None = None
    """None: OpenAI's default (auto with tools)."""
    parallel_tool_calls: bool | None = None
    constraint: Constraint | None = None
    """The answer's (response_format, text.format, output_config.format), already checked."""
    constraint_param: str | None = None
    template_kwargs: dict[str, Any] | None = None
    """The request's own chat_template_kwargs."""
    thinking: bool | None = None
    """Turn thinking on or off where the template can; None: its default."""
    effort: str | None = None
    budget: int | None = None
    """Tokens the thinking may take; None: no limit."""
    budget_param: str = "thinking_token_budget"
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    images: tuple[ImageRef, ...] = ()
    """The pictures, in order: each one IMAGE_MARKER in `messages`."""

    @property
    def forced(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, NamedFunction)
