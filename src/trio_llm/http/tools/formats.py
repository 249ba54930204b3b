"""The tool-call formats a model may be prompted and parsed in, chosen by `--tool-call-parser`.

What it owns: each format's tags and keys (one small record per format, no class hierarchy), how
an earlier call is written back into a conversation for a template that cannot take tools, and
which format `auto` picks from a chat template's text. Everything else (the streaming parser,
the grammar, the prompt) reads these records, so a new format is one entry in `FORMATS`.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    open_tag: str | None
    """What opens a call region (`<tool_call>`); None: a call is the whole answer, starting
    with `{` (llama3_json)."""
    close_tag: str | None
    arguments_key: str
    """The key the grammar writes the arguments under."""
    arguments_keys: tuple[str, ...]
    """The keys the parser accepts for them."""
    lists: bool
    """Whether one region holds a JSON list of calls (hermes: SmolLM2 writes one)."""

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """Earlier calls ({name, arguments as an object}) as the model writes them."""
        objects = [{"name": c["name"], self.arguments_key: c["arguments"]} for c in calls]
        if self.open_tag is None:
            return "; ".join(json.dumps(o, ensure_ascii=False) for o in objects)
        body = json.dumps(objects if self.lists else objects[0], ensure_ascii=False)
        if not self.lists and len(objects) > 1:
            return "\n".join(
                f"{self.open_tag}\n{json.dumps(o, ensure_ascii=False)}\n{self.close_tag}"
                for o in objects
            )
        return f"{self.open_tag}{body}{self.close_tag}"


HERMES = ToolFormat(
    name="hermes",
    open_tag="<tool_call>",
    close_tag="</tool_call>",
    arguments_key="arguments",
    arguments_keys=("arguments",),
    lists=True,
)
"""Hermes/Qwen/SmolLM2: `<tool_call>{...}</tool_call>`, or a JSON list of calls in one tag."""

LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    open_tag=None,
    close_tag=None,
    arguments_key="parameters",
    arguments_keys=("parameters", "arguments"),
    lists=False,
)
"""Llama 3.1-3.3's JSON calls: the answer is `{"name": ..., "parameters": {...}}` (`; `
between several)."""

FORMATS: dict[str, ToolFormat] = {f.name: f for f in (HERMES, LLAMA3_JSON)}
PARSER_NAMES: tuple[str, ...] = ("auto", *FORMATS)
"""The values of `--tool-call-parser`."""


OTHER_FORMATS: dict[str, str] = {
    "[TOOL_CALLS]": "Mistral's [TOOL_CALLS]",
    "<\uff5ctool\u2581calls\u2581begin\uff5c>": "DeepSeek V3's",
    "<|tool_call|>": "Granite's or Phi-4-mini's <|tool_call|>",
    "<|tool_calls_section_begin|>": "Kimi K2's",
    "<function=": "Llama 4's or Functionary's <function=...>",
    "<|action_start|>": "InternLM's",
    "<start_function_call>": "FunctionGemma's",
    "<minimax:tool_call>": "MiniMax's",
}
"""Marks of call formats chat templates write that the server does not read (yet): a
template that shows one gets its tools refused rather than a parser that would not see a call."""


class UnknownToolFormat(ValueError):
    """`auto` cannot tell which format the model writes its calls in; the message says what to
    do (name a format with `--tool-call-parser`)."""


def pick_format(name: str, chat_template: str | None) -> ToolFormat:
    """The format `name` means; `auto`: the one the chat template writes calls in, or hermes
    when the template does not take tools (the server's own tool prompt then teaches it).
    Raises `UnknownToolFormat` for a template that takes tools in a format the server does
    not read."""
    if name != "auto":
        return FORMATS[name]
    template = chat_template or ""
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or '"parameters"' in template:
        return LLAMA3_JSON
    served = ", ".join(FORMATS)
    advice = (
        f"start the server with --tool-call-parser set to one it reads ({served}) to prompt "
        "and constrain the model in that format instead"
    )
    for mark, family in OTHER_FORMATS.items():
        if mark in template:
            raise UnknownToolFormat(
                f"this model's chat template writes tool calls in {family} format, which "
                f"--tool-call-parser auto does not read; {advice}"
            )
    if template_takes_tools(chat_template):
        raise UnknownToolFormat(
            "this model's chat template takes tools but shows no call format that "
            f"--tool-call-parser auto recognises; {advice}"
        )
    return HERMES


@functools.lru_cache(maxsize=16)
def template_takes_tools(chat_template: str | None) -> bool:
    """Whether the template reads a `tools` variable (parsed, not searched: a template that
    only mentions the word does not count)."""
    if not chat_template:
        return False
    try:
        ast = jinja2.Environment().parse(chat_template)
    except jinja2.TemplateSyntaxError:
        return False
    return "tools" in jinja2.meta.find_undeclared_variables(ast)
