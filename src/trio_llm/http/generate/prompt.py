"""A conversation rendered into a prompt: the step chat, the Responses API and the Messages API
share between planning a request and generating.

In order: the tools (http/tools: rendered for the template or written into a system block, the
grammar that makes calls well-formed), the template's thinking switches (http/reasoning:
`enable_thinking`, `reasoning_effort`; the request's own chat_template_kwargs win), the chat
template itself, then the rendered prompt's end, which says whether the template opened or
closed the think block, and so where the output starts and whether the answer's constraint
must wait for the thinking to end. What comes out is the prompt, the constraint of the whole
output (validated with the grammar library when it is not the one the endpoint already
checked), and a factory of `AnswerReader`s that split each choice's text the same way.

Invariant: a constraint never applies to a thinking model's thinking, and asking for one never
turns the thinking off; a conversation needs the engine only to render and read back its
prompt's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from trio_llm.constraint import Constraint
from trio_llm.http.answer import AnswerReader
from trio_llm.http.conversation import IMAGE_MARKER, Conversation, uses_tools
from trio_llm.http.errors import bad_request
from trio_llm.http.generate.endpoint import check_constraint
from trio_llm.http.reasoning import (
    PROMPT_TAIL_TOKENS,
    ReasoningPlan,
    pick_reasoning_format,
    plan_reasoning,
    thinking_kwargs,
)
from trio_llm.http.tools import ToolPlan, plan_tools
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient
    from trio_llm.http.config import ServerConfig


@dataclass(frozen=True, slots=True)
class OutputFormats:
    """How a model writes what is not its answer's text, as the server was told (an endpoint
    that renders conversations is built with it)."""

    tool_call_parser: str
    """--tool-call-parser: the format tool calls are prompted, constrained and read in."""
    reasoning_parser: str
    """--reasoning-parser: the format a thinking model's thinking is read in."""

    @classmethod
    def of(cls, config: ServerConfig) -> OutputFormats:
        return cls(config.tool_call_parser, config.reasoning_parser)

    def of_model(self, engine: object) -> OutputFormats:
        """These formats with the model's own where it has them (`MODEL:tools=...,
        reasoning=...`), so one server hosts models that write different formats."""
        tools = getattr(engine, "tool_call_parser", None) or self.tool_call_parser
        reasoning = getattr(engine, "reasoning_parser", None) or self.reasoning_parser
        return OutputFormats(tools, reasoning)


@dataclass(frozen=True, slots=True)
class Rendered:
    token_ids: list[int]
    constraint: Constraint | None
    """Of the whole output: the answer's (or the calls'), after the thinking."""
    tools: ToolPlan | None
    reasoning: ReasoningPlan

    def new_reader(self) -> AnswerReader:
        """A reader for one choice's text: its thinking, its answer, its calls."""
        tools = None if self.tools is None else self.tools.new_parser()
        return AnswerReader(self.reasoning.new_parser(), tools)

    @property
    def keeps_special(self) -> bool:
        """Whether the output is decoded with its special tokens: the tool-call or reasoning
        format's markers are such tokens (`[TOOL_CALLS]`, Harmony's `<|channel|>`), which the
        parsers must see."""
        format = self.reasoning.format
        tools = self.tools is not None and self.tools.keeps_special
        return tools or (format is not None and format.keeps_special)

    def params(self, planned: SamplingParams) -> SamplingParams:
        """`planned` (what the endpoint's plan asked for) generating under the constraint of
        the whole output, decoded with special tokens when the parsers need them."""
        updates: dict[str, object] = {}
        if self.constraint != planned.constraint:
            updates["constraint"] = self.constraint
        if self.keeps_special and planned.skip_special_tokens:
            updates["skip_special_tokens"] = False
        return msgspec.structs.replace(planned, **updates) if updates else planned


def with_image_tokens(engine: EngineClient, conversation: Conversation) -> list[dict[str, Any]]:
    """The messages with each picture's marker replaced by the model's image token (which its
    processor expands); a 400 naming the first picture for a model that takes none."""
    if engine.images is None:
        first = conversation.images[0].param
        raise bad_request(
            f"{first}: the model {engine.model_config.model} takes text only, not images",
            param=first,
        )
    token = engine.images.image_token
    return [
        {**m, "content": m["content"].replace(IMAGE_MARKER, token)}
        if isinstance(m.get("content"), str)
        else m
        for m in conversation.messages
    ]


async def render_conversation(
    engine: EngineClient, conversation: Conversation, formats: OutputFormats
) -> Rendered:
    """The prompt of `conversation` for `engine`'s model, with the server's tool-call and
    reasoning `formats`; a 400 naming the parameter when the constraint of the whole output
    cannot be enforced."""
    template = engine.chat_template
    formats = formats.of_model(engine)
    messages = conversation.messages
    if conversation.images:
        messages = with_image_tokens(engine, conversation)
    kwargs = thinking_kwargs(template, enabled=conversation.thinking, effort=conversation.effort)
    constraint, param = conversation.constraint, conversation.constraint_param
    tools = None
    if conversation.tools or uses_tools(messages):
        tools = plan_tools(
            conversation.tools,
            conversation.tool_choice,
            conversation.parallel_tool_calls,
            messages,
            chat_template=template,
            parser=formats.tool_call_parser,
            # A forced call's grammar wins over the answer's format; with auto, one grammar
            # allows either calls or an answer in that format.
            answer=constraint,
        )
        messages = tools.messages
        kwargs.update(tools.template_kwargs)
        if tools.constraint is not constraint:
            constraint, param = tools.constraint, "tools"
    kwargs.update(conversation.template_kwargs or {})
    token_ids = await engine.apply_chat_template(
        messages,
        add_generation_prompt=conversation.add_generation_prompt,
        continue_final_message=conversation.continue_final_message,
        chat_template_kwargs=kwargs or None,
        add_special_tokens=conversation.add_special_tokens,
    )
    reasoning = ReasoningPlan(None)
    format = pick_reasoning_format(formats.reasoning_parser, template)
    if format is not None:
        tail = await engine.decode(token_ids[-PROMPT_TAIL_TOKENS:], skip_special_tokens=False)
        reasoning = plan_reasoning(format, tail, conversation.budget, conversation.thinking)
        if constraint is None:
            param = conversation.budget_param
        constraint = reasoning.constrain(constraint)
    if constraint != conversation.constraint:
        await check_constraint(constraint, param, engine.unproducible_bytes)
    return Rendered(token_ids, constraint, tools, reasoning)
