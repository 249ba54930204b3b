"""A Messages request validated into a plan: the conversation in the chat shape http/tools
renders, the `SamplingParams`, the tools and the thinking asked for.

Owns what Anthropic's fields mean here: `system` (a string or text blocks) as the system
message; each message's blocks in order (text joined, an assistant's `tool_use` blocks as its
tool calls, a user's `tool_result` blocks as tool messages, an assistant's thinking blocks,
their signatures verified (an edited one is a 400), as its `reasoning_content`, which the chat
template shows again or drops as it does for chat); a conversation that ends with the
assistant's text is continued from it (Anthropic's prefill); `max_tokens` (required),
`stop_sequences`, the sampling fields with the model's defaults; `tools` and `tool_choice`
(auto, any, tool, none; disable_parallel_tool_use) as http/tools takes them; `thinking`
(enabled with its budget, adaptive, disabled) and `output_config` (a JSON schema for the
answer, the effort). Images, documents and Anthropic's server tools are refused with a 400
naming where they are. Invariant: nothing here touches
Quart or the engine; every way a request can be wrong ends in a `ProtocolError` naming the
parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trio_llm.constraint import Constraint
from trio_llm.http.anthropic.protocol import (
    ConversationFields,
    DocumentBlockIn,
    ImageBlockIn,
    MessageIn,
    MessagesRequest,
    RedactedThinkingBlockIn,
    SearchResultBlockIn,
    TextBlockIn,
    ThinkingAdaptive,
    ThinkingBlockIn,
    ThinkingDisabled,
    ThinkingEnabled,
    ToolChoiceAny,
    ToolChoiceNone,
    ToolChoiceTool,
    ToolResultBlockIn,
    ToolUseBlockIn,
)
from trio_llm.http.anthropic.signing import PROCESS_KEY, unseal
from trio_llm.http.conversation import IMAGE_MARKER, Conversation, ImageRef
from trio_llm.http.errors import ProtocolError, bad_request, not_supported
from trio_llm.http.sampling import OneSequence, RequestLimits, SamplingDefaults, stop_list
from trio_llm.http.structured import validated
from trio_llm.http.tools import FunctionTool, NamedFunction, ToolChoiceValue, check_tools
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError


@dataclass(frozen=True, slots=True)
class MessagesPlan(OneSequence):
    """A validated Messages request: the conversation and how to sample the answer."""

    conversation: Conversation
    params: SamplingParams
    stop_sequences: tuple[str, ...] = ()
    show_thinking: bool = True
    """False (`thinking.display: omitted`): thinking blocks come back empty, with their
    signature."""

    @property
    def max_tokens_param(self) -> str:
        return "max_tokens"

    @property
    def constraint_param(self) -> str | None:
        """The field the answer's constraint came from (`output_config.format.schema`)."""
        return self.conversation.constraint_param


def _text(
    block: TextBlockIn | SearchResultBlockIn | ImageBlockIn | DocumentBlockIn, where: str
) -> str:
    if isinstance(block, TextBlockIn):
        return block.text
    raise not_supported(where, f"{_KINDS[type(block)]} content")


_KINDS: dict[type, str] = {
    ImageBlockIn: "Image",
    DocumentBlockIn: "Document",
    SearchResultBlockIn: "Search-result",
}


def _tool_result(block: ToolResultBlockIn, where: str, images: list[ImageRef]) -> dict[str, Any]:
    """A tool result as a tool message; an image in it (a screenshot tool's, as computer use
    and MCP tools send) IMAGE_MARKER in its text, the picture appended to `images`."""
    content = block.content
    if isinstance(content, list):
        pieces = []
        for k, b in enumerate(content):
            if isinstance(b, ImageBlockIn):
                images.append(_image(b, f"{where}.content[{k}]"))
                pieces.append(IMAGE_MARKER)
            else:
                pieces.append(_text(b, f"{where}.content[{k}]"))
        content = "\n".join(pieces)
    text = content or ""
    if block.is_error:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": block.tool_use_id, "content": text}


def _image(block: ImageBlockIn, where: str) -> ImageRef:
    """An image block's picture as a URL (a base64 source as a data: URL)."""
    source = block.source or {}
    param = f"{where}.source"
    if source.get("type") == "base64":
        media_type, data = source.get("media_type", "image/png"), source.get("data")
        if not isinstance(data, str):
            raise bad_request(f"{param}.data is required", param=f"{param}.data")
        return ImageRef(f"data:{media_type};base64,{data}", param)
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return ImageRef(source["url"], param)
    raise bad_request(
        f"{param}: give a base64 source or a url source (type 'base64' or 'url')", param=param
    )


def _message(
    message: MessageIn, where: str, key: bytes, images: list[ImageRef]
) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages: a user's tool results become tool messages
    (before its text), an assistant's tool uses its calls, its thinking (verified against
    its signature) its `reasoning_content`, an image block IMAGE_MARKER in its text (the
    picture appended to `images`, in the order the messages render: tool results first)."""
    role = message.role
    if isinstance(message.content, str):
        return [{"role": role, "content": message.content}]
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    # The tool messages render before the message's text: their pictures come first.
    result_images: list[ImageRef] = []
    text_images: list[ImageRef] = []
    for j, block in enumerate(message.content):
        at = f"{where}.content[{j}]"
        if isinstance(block, ThinkingBlockIn):
            # The signature carries the thinking: an omitted block (empty) gets it back.
            thought = unseal(block.signature, key)
            if thought is None or (block.thinking and block.thinking != thought):
                raise bad_request(
                    f"{at}.signature: Invalid `signature` in `thinking` block: this server did "
                    "not sign this thinking (edited, from another model, or signed before a "
                    "restart without --thinking-secret)",
                    param=f"{at}.signature",
                )
            thoughts.append(thought)
            continue
        if isinstance(block, RedactedThinkingBlockIn):
            raise bad_request(
                f"{at}.data: Invalid `data` in `redacted_thinking` block: this server writes "
                "no redacted thinking",
                param=f"{at}.data",
            )
        if isinstance(block, ToolUseBlockIn):
            if role != "assistant":
                raise bad_request(f"{at}: only the assistant uses tools", param=at)
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlockIn):
            if role != "user":
                raise bad_request(f"{at}: tool results come in a user message", param=at)
            results.append(_tool_result(block, at, result_images))
        elif isinstance(block, ImageBlockIn):
            text_images.append(_image(block, at))
            texts.append(IMAGE_MARKER)
        else:
            texts.append(_text(block, at))
    images += result_images + text_images
    out = list(results)
    if calls:
        out.append({"role": role, "content": "".join(texts) or None, "tool_calls": calls})
    elif texts or not results or thoughts:
        out.append({"role": role, "content": "".join(texts)})
    if thoughts and role == "assistant":
        # The template decides what the model sees again: Qwen3's shows the thinking of the
        # turns since the last user message (a tool loop's) and drops earlier turns', as
        # Anthropic documents for its models.
        out[-1]["reasoning_content"] = "\n".join(thoughts)
    return out


def _system(system: str | list[TextBlockIn] | None) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "\n".join(b.text for b in system)
    return [{"role": "system", "content": text}] if text else []


def conversation_messages(
    request: ConversationFields, key: bytes, images: list[ImageRef] | None = None
) -> tuple[list[dict[str, Any]], bool]:
    """The chat messages of the request, and whether the answer continues the last one;
    thinking blocks are verified with `key`, its pictures appended to `images`, in order."""
    images = [] if images is None else images
    if not request.messages:
        raise bad_request("messages: at least one message is required", param="messages")
    messages = _system(request.system)
    for i, message in enumerate(request.messages):
        messages += _message(message, f"messages[{i}]", key, images)
    last = request.messages[-1]
    continues = last.role == "assistant" and not messages[-1].get("tool_calls")
    return messages, continues


def _tools(request: ConversationFields) -> tuple[list[FunctionTool], ToolChoiceValue, bool | None]:
    tools = []
    for i, tool in enumerate(request.tools or ()):
        if tool.type not in (None, "custom"):
            raise not_supported(f"tools[{i}].type", f"The server tool {tool.type!r}")
        if tool.input_schema is None:
            raise bad_request(
                f"tools[{i}].input_schema: this field is required", param=f"tools[{i}].input_schema"
            )
        tools.append(FunctionTool(tool.name, tool.description, tool.input_schema))
    given = request.tool_choice
    choice: ToolChoiceValue | None
    if given is None:
        choice = None
    elif isinstance(given, ToolChoiceNone):
        choice = "none"
    elif isinstance(given, ToolChoiceAny):
        choice = "required"
    elif isinstance(given, ToolChoiceTool):
        choice = NamedFunction(given.name)
    else:
        choice = "auto"
    parallel = None
    if given is not None and not isinstance(given, ToolChoiceNone):
        parallel = False if given.disable_parallel_tool_use else None
    return tools, check_tools(tools, choice), parallel


def plan_conversation(request: ConversationFields, key: bytes) -> Conversation:
    if request.mcp_servers:
        raise not_supported("mcp_servers", "Connecting to MCP servers")
    if request.context_management and request.context_management.get("edits"):
        raise not_supported("context_management", "Context editing")
    images: list[ImageRef] = []
    messages, continues = conversation_messages(request, key, images)
    tools, choice, parallel = _tools(request)
    thinking, budget = None, None
    given = request.thinking
    if isinstance(given, ThinkingEnabled):
        thinking, budget = True, given.budget_tokens
    elif isinstance(given, ThinkingAdaptive):
        thinking = True
    elif isinstance(given, ThinkingDisabled):
        thinking = False
    output = request.output_config
    constraint = None
    if output is not None and output.format is not None:
        constraint = validated(
            Constraint.json_schema(output.format.schema), "output_config.format.schema"
        )
    if choice not in ("none", "auto") and constraint is not None:
        raise bad_request(
            "tool_choice: a forced call cannot be combined with output_config.format",
            param="tool_choice",
        )
    return Conversation(
        messages,
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        constraint=None if constraint is None else constraint[0],
        constraint_param=None if constraint is None else constraint[1],
        thinking=thinking,
        effort=None if output is None else output.effort,
        budget=budget,
        budget_param="thinking.budget_tokens",
        add_generation_prompt=not continues,
        continue_final_message=continues,
        images=tuple(images),
    )


def plan_messages(
    request: MessagesRequest,
    limits: RequestLimits,
    defaults: SamplingDefaults,
    key: bytes = PROCESS_KEY,
) -> MessagesPlan:
    conversation = plan_conversation(request, key)
    if conversation.budget is not None and conversation.budget >= request.max_tokens:
        raise bad_request(
            "thinking.budget_tokens: must be less than max_tokens "
            f"({conversation.budget} >= {request.max_tokens})",
            param="thinking.budget_tokens",
        )
    try:
        stops = stop_list(request.stop_sequences, limits)
    except ProtocolError as error:
        error.param = "stop_sequences"
        raise
    params = SamplingParams(
        max_tokens=request.max_tokens,
        **defaults.fill(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=None,
            repetition_penalty=None,
        ),
        stop=stops,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        constraint=conversation.constraint,
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        param = "stop_sequences" if error.param == "stop" else error.param
        raise bad_request(str(error), param=param) from None
    display = getattr(request.thinking, "display", None)
    return MessagesPlan(conversation, params, tuple(stops), show_thinking=display != "omitted")
