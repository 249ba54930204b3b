"""A request's tools, choice and conversation turned into what generation needs.

`plan_tools` is the one entry point, shared by /v1/chat/completions and the Responses API: it
checks the choice against the tools, renders the conversation for the model's template, and
returns the constraint that makes the calls well-formed and the parser that reads them back.
Invariant: every way the tools can be wrong is a 400 naming the parameter (`ProtocolError`),
raised before anything reaches the engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from trio_llm.constraint import MAX_SCHEMA_DEPTH, Constraint, schema_bound_error, schema_depth
from trio_llm.grammar import ConstraintError
from trio_llm.http.errors import bad_request
from trio_llm.http.tools.formats import (
    HERMES,
    ToolFormat,
    UnknownToolFormat,
    pick_format,
    template_takes_tools,
    writes_args_marker,
)
from trio_llm.http.tools.grammar import tool_grammar
from trio_llm.http.tools.marked import MarkedCallParser
from trio_llm.http.tools.parser import ToolCallParser
from trio_llm.http.tools.prompting import FunctionTool, render_messages
from trio_llm.http.tools.pythonic import PythonicCallParser


@dataclass(frozen=True, slots=True)
class NamedFunction:
    """`tool_choice` naming the one function to call."""

    name: str


ToolChoiceValue = Literal["none", "auto", "required"] | NamedFunction


@dataclass(frozen=True, slots=True)
class ToolPlan:
    messages: list[dict[str, Any]]
    """The conversation as the chat template renders it."""
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    """For `apply_chat_template` (`tools`, when the template takes them)."""
    constraint: Constraint | None = None
    """The whole answer's constraint: the calls' grammar (offering the request's own answer
    constraint beside them with auto), or with tool_choice none the request's own."""
    format: ToolFormat | None = None
    """None: the answer is not parsed for calls."""
    schemas: dict[str, Any] = field(default_factory=dict)
    """Each tool's parameters schema, by name (Qwen3-Coder's values are typed by them)."""

    @property
    def keeps_special(self) -> bool:
        """Whether the output must be decoded with special tokens kept (the format's markers
        are special tokens: Mistral's `[TOOL_CALLS]`, Harmony's channels)."""
        return self.format is not None and self.format.keeps_special

    def new_parser(self) -> CallParser | None:
        """A parser for one choice's output; None when calls are not read."""
        if self.format is None:
            return None
        if self.format.reader == "marked":
            return MarkedCallParser(self.format, self.schemas)
        if self.format.reader == "pythonic":
            return PythonicCallParser(self.format)
        return ToolCallParser(self.format)


CallParser = ToolCallParser | MarkedCallParser | PythonicCallParser
"""A streaming call parser of one of the readers (the same `feed`, `end`, `finish`)."""


def check_tools(
    tools: Sequence[FunctionTool], tool_choice: ToolChoiceValue | None, param: str = "tools"
) -> ToolChoiceValue:
    """The choice in force (OpenAI's default: auto with tools, none without), or a 400."""
    for i, tool in enumerate(tools):
        depth = schema_depth(tool.parameters)
        if depth > MAX_SCHEMA_DEPTH:
            raise bad_request(
                f"{param}[{i}]: the parameters' schema is nested {depth} levels deep; at most "
                f"{MAX_SCHEMA_DEPTH} are allowed",
                param=param,
            )
        if bound := schema_bound_error(tool.parameters):
            raise bad_request(f"{param}[{i}]: {bound}", param=param)
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        duplicate = next(n for n in names if names.count(n) > 1)
        raise bad_request(f"{param}: the function {duplicate!r} is given twice", param=param)
    choice = tool_choice if tool_choice is not None else ("auto" if tools else "none")
    if choice != "none" and not tools:
        raise bad_request(
            "tool_choice: needs tools (there are none to choose from)", param="tool_choice"
        )
    if isinstance(choice, NamedFunction) and choice.name not in names:
        raise bad_request(
            f"tool_choice: the function {choice.name!r} is not among the tools",
            param="tool_choice",
        )
    return choice


def plan_tools(
    tools: Sequence[FunctionTool],
    tool_choice: ToolChoiceValue | None,
    parallel_tool_calls: bool | None,
    messages: Sequence[dict[str, Any]],
    *,
    chat_template: str | None,
    parser: str = "auto",
    answer: Constraint | None = None,
) -> ToolPlan:
    """What generating with these tools takes.

    `messages` are in OpenAI's chat shape (plain-text `content`; an assistant's `tool_calls`
    as `[{"id", "type", "function": {"name", "arguments": JSON text}}]`; `tool` messages with
    `tool_call_id`). `chat_template` is the model's (it decides whether tools go to the
    template or into a system block the server writes); `parser` is `--tool-call-parser`.
    `answer`: the request's own constraint (response_format, text.format, structured
    outputs). With `auto` the grammar allows either calls or an answer that meets it; a forced
    call wins over it; with `none` it is the whole constraint.
    """
    choice = check_tools(tools, tool_choice)
    try:
        format = pick_format(parser, chat_template)
    except UnknownToolFormat as error:
        if choice != "none":
            raise bad_request(f"tools: {error}", param="tools") from None
        format = HERMES  # shown to no one: the template writes the history itself
    if writes_args_marker(format, chat_template):
        format = dataclasses.replace(format, lists=False)  # `name[ARGS]{...}` per call
    takes_tools = template_takes_tools(chat_template)
    shown = list(tools) if choice != "none" else []
    rendered = render_messages(messages, shown, format, takes_tools=takes_tools)
    kwargs = {"tools": [t.openai() for t in shown]} if takes_tools and shown else {}
    if choice == "none":
        return ToolPlan(rendered, kwargs, answer)
    if isinstance(choice, NamedFunction):
        forced = [t for t in tools if t.name == choice.name]
        grammar = tool_grammar(format, forced, forced=True, parallel=False)
    else:
        required = choice == "required"
        try:
            grammar = tool_grammar(
                format,
                tools,
                forced=required,
                parallel=parallel_tool_calls is not False,
                answer=None if required else answer,
            )
        except ConstraintError as error:
            raise bad_request(
                f"tool_choice: auto cannot be offered beside this answer constraint: {error}; "
                "use tool_choice required or none with it",
                param="tool_choice",
            ) from None
    schemas = {t.name: t.parameters for t in tools if t.parameters is not None}
    return ToolPlan(rendered, kwargs, Constraint.grammar(grammar), format, schemas)
