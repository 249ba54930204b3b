"""The tool-call formats a model may be prompted and parsed in, chosen by `--tool-call-parser`
(vLLM's names) or per model (`MODEL:tools=FORMAT`).

What it owns: each format's tags and keys (one small record per format, no class hierarchy), how
an earlier call is written back into a conversation for a template that cannot take tools, and
which format `auto` picks from a chat template's text. Everything else (the streaming parsers,
the grammar, the prompt) reads these records, so a new format is one entry in `FORMATS` (and,
for a new `reader`, a parser and a grammar rule).
"""

from __future__ import annotations

import functools
import json
import secrets
import string
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import jinja2.meta

Reader = Literal["json", "marked", "pythonic"]
"""How calls are read: `json`, call objects (`{"name", "arguments"}`) after an open tag or at the
answer's start (parser.py); `marked`, a name and arguments between control markers
(marked.py); `pythonic`, a Python list of calls at the answer's start (pythonic.py)."""

_ID_CHARS = string.ascii_letters + string.digits


@dataclass(frozen=True, slots=True)
class ToolFormat:
    name: str
    open_tag: str | None
    """What opens a call region (`<tool_call>`); None: a call is the whole answer, starting
    with `{` (llama3_json) or `[` (pythonic)."""
    close_tag: str | None
    """What closes it; None: the region runs to the output's end."""
    arguments_key: str = "arguments"
    """The key the grammar writes the arguments under."""
    arguments_keys: tuple[str, ...] = ("arguments",)
    """The keys the parser accepts for them."""
    lists: bool = False
    """Whether one region holds a JSON list of calls (hermes: SmolLM2 writes one)."""
    reader: Reader = "json"
    call_open: str = ""
    """marked: what opens each call inside the region (DeepSeek's call-begin marker)."""
    call_close: str = ""
    """marked: what ends each call inside the region; empty: the region is one call."""
    args_marker: str = ""
    """json: a marker between a bare name and its arguments object (Mistral's v11 `[ARGS]`)."""
    dropped: tuple[str, ...] = ()
    """Control text that is neither content nor a call (Harmony's channel headers)."""
    keeps_special: bool = False
    """Its markers are special tokens: the output is decoded with them kept."""
    short_ids: bool = False
    """Call ids of 9 letters and digits (Mistral's templates refuse any other)."""
    header: str = ""
    """What may come before a forced call (Harmony's `<|start|>assistant` after thinking)."""
    closes_output: bool = False
    """The close tag is an end-of-sequence token: the grammar ends where it would be."""

    def new_call_id(self) -> str:
        if self.short_ids:
            return "".join(secrets.choice(_ID_CHARS) for _ in range(9))
        return "call_" + uuid.uuid4().hex[:24]

    def render_calls(self, calls: list[dict[str, Any]]) -> str:
        """Earlier calls ({name, arguments as an object}) as the model writes them."""
        if self.reader == "pythonic":
            return "[" + ", ".join(_python_call(c) for c in calls) + "]"
        if self.reader == "marked":
            return "".join(_marked_call(self, c) for c in calls)
        objects = [{"name": c["name"], self.arguments_key: c["arguments"]} for c in calls]
        close = self.close_tag or ""
        if self.open_tag is None:
            return "; ".join(json.dumps(o, ensure_ascii=False) for o in objects)
        body = json.dumps(objects if self.lists else objects[0], ensure_ascii=False)
        if not self.lists and len(objects) > 1:
            return "\n".join(
                f"{self.open_tag}\n{json.dumps(o, ensure_ascii=False)}\n{close}" for o in objects
            )
        return f"{self.open_tag}{body}{close}"


def _marked_call(format: ToolFormat, call: dict[str, Any]) -> str:
    name, arguments = call["name"], call["arguments"]
    text = json.dumps(arguments, ensure_ascii=False)
    if format.name == "qwen3_coder":
        pairs = arguments.items() if isinstance(arguments, dict) else ()
        parameters = "".join(
            f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
            for k, v in pairs
        )
        return f"<tool_call>\n<function={name}>\n{parameters}</function>\n</tool_call>"
    if format.name == "deepseek_v3":
        call_text = f"{format.call_open}function{DEEPSEEK_SEP}{name}\n```json\n{text}\n```"
        return f"{format.open_tag}{call_text}{format.call_close}{format.close_tag}"
    return f"{format.open_tag}{name} <|constrain|>json<|message|>{text}{format.close_tag}"


def _python_call(call: dict[str, Any]) -> str:
    arguments = call["arguments"] if isinstance(call["arguments"], dict) else {}
    pairs = ", ".join(f"{k}={_python_value(v)}" for k, v in arguments.items())
    return f"{call['name']}({pairs})"


def _python_value(value: Any) -> str:
    if value is True or value is False or value is None:
        return repr(value)
    return json.dumps(value, ensure_ascii=False)


HERMES = ToolFormat(name="hermes", open_tag="<tool_call>", close_tag="</tool_call>", lists=True)
"""Hermes/Qwen/SmolLM2: `<tool_call>{...}</tool_call>`, or a JSON list of calls in one tag."""

LLAMA3_JSON = ToolFormat(
    name="llama3_json",
    open_tag=None,
    close_tag=None,
    arguments_key="parameters",
    arguments_keys=("parameters", "arguments"),
)
"""Llama 3.1-3.3's JSON calls: the answer is `{"name": ..., "parameters": {...}}` (`; `
between several)."""

MISTRAL = ToolFormat(
    name="mistral",
    open_tag="[TOOL_CALLS]",
    close_tag=None,
    lists=True,
    args_marker="[ARGS]",
    keeps_special=True,
    short_ids=True,
)
"""Mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (tokenizers before v11), or
`[TOOL_CALLS]name[ARGS]{...}` per call (v11 on: Mistral Small 3.2, Magistral, Devstral: the
grammar writes that form when the template shows `[ARGS]`). `[TOOL_CALLS]` is a control token;
call ids are 9 letters and digits."""

GRANITE = ToolFormat(
    name="granite", open_tag="<|tool_call|>", close_tag=None, lists=True, keeps_special=True
)
"""IBM Granite 3.x: `<|tool_call|>[{"name": ..., "arguments": {...}}]`."""

PYTHONIC = ToolFormat(name="pythonic", open_tag=None, close_tag=None, reader="pythonic")
"""Llama 3.2 and 4's pythonic calls: the answer is `[f(a=1), g(b="x")]`."""

QWEN3_CODER = ToolFormat(
    name="qwen3_coder", open_tag="<tool_call>", close_tag="</tool_call>", reader="marked"
)
"""Qwen3-Coder: `<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
</function>\\n</tool_call>`, a value as plain text (its type from the tool's schema)."""

DEEPSEEK_V3 = ToolFormat(
    name="deepseek_v3",
    open_tag="<\uff5ctool\u2581calls\u2581begin\uff5c>",
    close_tag="<\uff5ctool\u2581calls\u2581end\uff5c>",
    reader="marked",
    call_open="<\uff5ctool\u2581call\u2581begin\uff5c>",
    call_close="<\uff5ctool\u2581call\u2581end\uff5c>",
    keeps_special=True,
)
"""DeepSeek-V3/R1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n
```json\\n{...}\\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>` (V3.1's `NAME<｜tool▁sep｜>{...}`
is read too)."""
DEEPSEEK_SEP = "<\uff5ctool\u2581sep\uff5c>"

OPENAI = ToolFormat(
    name="openai",
    open_tag="<|channel|>commentary to=functions.",
    close_tag="<|call|>",
    reader="marked",
    dropped=("<|start|>assistant", "<|channel|>final<|message|>", "<|end|>", "<|return|>"),
    keeps_special=True,
    header="<|start|>assistant",
    closes_output=True,
)
"""gpt-oss's Harmony: `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>
{...}<|call|>` (`<|call|>` is an end-of-sequence token: the output usually ends before it)."""

FORMATS: dict[str, ToolFormat] = {
    f.name: f
    for f in (HERMES, LLAMA3_JSON, MISTRAL, PYTHONIC, QWEN3_CODER, DEEPSEEK_V3, GRANITE, OPENAI)
}
PARSER_NAMES: tuple[str, ...] = ("auto", *FORMATS)
"""The values of `--tool-call-parser` (and of a model's `tools=` option)."""

_MARKS: tuple[tuple[tuple[str, ...], ToolFormat], ...] = (
    (("<|channel|>", "to=functions."), OPENAI),
    (("[TOOL_CALLS]",), MISTRAL),
    (("<\uff5ctool\u2581calls\u2581begin\uff5c>",), DEEPSEEK_V3),
    (("<|tool_call|>",), GRANITE),
    (("<function=", "<parameter="), QWEN3_CODER),
    (("<tool_call>",), HERMES),
    (("[func_name1(",), PYTHONIC),
    (("<|python_tag|>",), LLAMA3_JSON),
    (('"parameters"',), LLAMA3_JSON),
)
"""What `auto` looks for in a template, first match wins (Qwen3-Coder's templates also show
`<tool_call>`; Llama 3.2's pythonic template also says "parameters")."""

OTHER_FORMATS: dict[str, str] = {
    "<|tool_calls_section_begin|>": "Kimi K2's",
    "<|action_start|>": "InternLM's",
    "<start_function_call>": "FunctionGemma's",
    "<minimax:tool_call>": "MiniMax's",
    "<function=": "Functionary's <function=...>",
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
    for marks, format in _MARKS:
        if all(mark in template for mark in marks):
            return format
    served = ", ".join(FORMATS)
    advice = (
        f"start the server with --tool-call-parser (or the model's tools= option) set to one "
        f"it reads ({served}) to prompt and constrain the model in that format instead"
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


def writes_args_marker(format: ToolFormat, chat_template: str | None) -> bool:
    """Whether calls in `format` are written `name[ARGS]{...}` (Mistral's v11 templates)."""
    return bool(format.args_marker) and format.args_marker in (chat_template or "")


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
