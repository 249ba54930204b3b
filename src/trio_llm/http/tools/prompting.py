"""How the tools and a conversation's earlier calls reach the model.

A chat template that takes `tools` (most current models') gets them through
`apply_chat_template(tools=...)`, and the history in the shape those templates read (a call's
arguments as an object). For one that does not (the default SmolLM2-135M-Instruct), the server
writes what the template cannot: the SmolLM2/Hermes tool block in the system message, earlier
calls as the model would have written them, results inside `<tool_response>`. Invariant: the
template sees plain messages it can render either way, and no tool message is dropped.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trio_llm.http.tools.formats import ToolFormat


@dataclass(frozen=True, slots=True)
class FunctionTool:
    """One function the model may call (from chat's `tools` or the Responses API's)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    """A JSON schema of the arguments object; None: no arguments."""

    def openai(self) -> dict[str, Any]:
        """The tool as chat templates take it (OpenAI's chat shape)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters or {"type": "object", "properties": {}}
        return {"type": "function", "function": function}


_SMOLLM2_BLOCK = """\
You are an expert in composing functions. You are given a question and a set of possible \
functions. Based on the question, you will need to make one or more function/tool calls to \
achieve the purpose. If none of the functions can be used, point it out and refuse to answer. \
If the given question lacks the parameters required by the function, also point it out.

You have access to the following tools:
<tools>{tools}</tools>

The output MUST strictly adhere to the following format, and NO other text MUST be included.
The example format is as follows. Please make sure the parameter type is correct. If no \
function call is needed, please make the tool calls an empty list '[]'.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
... (more tool calls as required)
]</tool_call>"""
"""SmolLM2's documented tool prompt (its model card), which Hermes-style models also follow."""

_LLAMA3_BLOCK = """\
You have access to the following functions. To call a function, respond with JSON for a \
function call in the format {{"name": function name, "parameters": dictionary of argument \
name and its value}}. Do not use variables.

{tools}"""


_EXAMPLE_BLOCK = """\
You have access to the following functions:
{tools}

To call functions, answer with the calls only, written like this:
{example}"""
"""For the other formats: the tools, and a call written in the format as an example."""


def tools_block(tools: Sequence[FunctionTool], format: ToolFormat) -> str:
    """The system text that teaches a model without tool support in its template the tools
    and the format to call them in."""
    listed = [t.openai()["function"] for t in tools]
    if format.name == "llama3_json":
        return _LLAMA3_BLOCK.format(
            tools="\n".join(json.dumps(t, ensure_ascii=False) for t in listed)
        )
    if format.name == "hermes":
        return _SMOLLM2_BLOCK.format(tools=json.dumps(listed, ensure_ascii=False))
    example = format.render_calls([{"name": "func_name1", "arguments": {"argument1": "value1"}}])
    return _EXAMPLE_BLOCK.format(tools=json.dumps(listed, ensure_ascii=False), example=example)


def _arguments(text: str) -> Any:
    """An earlier call's arguments as an object (templates iterate them); text that is not
    JSON stays text."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}
        for c in message.get("tool_calls") or ()
    ]


def render_messages(
    messages: Sequence[dict[str, Any]],
    tools: Sequence[FunctionTool],
    format: ToolFormat,
    *,
    takes_tools: bool,
) -> list[dict[str, Any]]:
    """The conversation (OpenAI chat shape: `tool_calls` with JSON-text arguments, `tool`
    messages with `tool_call_id`) as the template renders it; `tools`: those to show the
    model (none with tool_choice none)."""
    if takes_tools:
        out = []
        for message in messages:
            message = dict(message)
            if message.get("tool_calls"):
                message["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["function"]["name"],
                            "arguments": _arguments(c["function"]["arguments"]),
                        },
                    }
                    for c in message["tool_calls"]
                ]
            out.append(message)
        return out
    out = []
    for message in messages:
        role, content = message["role"], message.get("content") or ""
        if message.get("tool_calls"):
            written = format.render_calls(_calls(message))
            content = f"{content}\n{written}" if content else written
        elif role == "tool":
            content = f"<tool_response>\n{content}\n</tool_response>"
        out.append({"role": role, "content": content})
    if tools:
        block = tools_block(tools, format)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out
