"""Tool calling: prompting a model with functions, constraining and parsing its calls.

The interface, shared by /v1/chat/completions and the Responses API (nothing here reads a
request body or touches Quart):

    plan = plan_tools(tools, tool_choice, parallel_tool_calls, messages,
                      chat_template=tokenizer.chat_template, parser="auto")
    # plan.messages, plan.template_kwargs -> apply_chat_template(...)
    # plan.constraint -> SamplingParams(constraint=...) (None: unconstrained)
    parser = plan.new_parser()          # one per choice; None: calls are not read
    content_delta, call_deltas = parser.feed(delta_text)   # while streaming
    content_delta, call_deltas = parser.end()              # at the output's end
    content, calls = parser.finish()    # the whole content and the `ToolCall`s

`tools` are `FunctionTool(name, description, parameters)`; `tool_choice` is "none", "auto",
"required", a `NamedFunction(name)` or None (OpenAI's default); `messages` are OpenAI chat
messages (see `plan_tools`). A `ToolCallDelta` is (index, id, name, arguments fragment): the
first of a call has the id and name, its fragments concatenate to `ToolCall.arguments`.
Modules: formats (hermes, llama3_json, mistral, pythonic, qwen3_coder, deepseek_v3, granite,
openai; `auto` from the template), prompting (the tool block for templates without tools),
grammar (the lazily triggered or forced Lark grammar) and call_rules (one call in each format's
syntax), the streaming parsers: parser (JSON calls), marked (calls between control markers),
pythonic (a Python list of calls); planning (`plan_tools`).
"""

from trio_llm.http.tools.formats import (
    FORMATS,
    PARSER_NAMES,
    ToolFormat,
    UnknownToolFormat,
    pick_format,
    template_takes_tools,
)
from trio_llm.http.tools.marked import MarkedCallParser
from trio_llm.http.tools.parser import ToolCall, ToolCallDelta, ToolCallParser, new_call_id
from trio_llm.http.tools.planning import (
    CallParser,
    NamedFunction,
    ToolChoiceValue,
    ToolPlan,
    check_tools,
    plan_tools,
)
from trio_llm.http.tools.prompting import FunctionTool
from trio_llm.http.tools.pythonic import PythonicCallParser

__all__ = [
    "FORMATS",
    "PARSER_NAMES",
    "CallParser",
    "FunctionTool",
    "MarkedCallParser",
    "NamedFunction",
    "PythonicCallParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallParser",
    "ToolChoiceValue",
    "ToolFormat",
    "ToolPlan",
    "UnknownToolFormat",
    "check_tools",
    "new_call_id",
    "pick_format",
    "plan_tools",
    "template_takes_tools",
]
