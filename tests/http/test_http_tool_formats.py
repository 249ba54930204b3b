"""The tool-call formats beyond hermes and llama3_json, without a server: each parser on
hand-written model text split at every point, each format's grammar against llguidance (the
default tokenizer with the format's special tokens added), and `auto` picking the format from
a chat template written the family's way (the templates live in tool_format_templates.py,
which the server test shares)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from llguidance import LLMatcher
from tool_format_templates import SPECIAL_TOKENS, TEMPLATES
from transformers import AutoTokenizer

from trio_llm.grammar import grammar_vocabulary
from trio_llm.http.tools import FORMATS, FunctionTool, NamedFunction, pick_format, plan_tools
from trio_llm.http.tools.grammar import tool_grammar

WEATHER = FunctionTool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "metric": {"type": "boolean"},
        },
        "required": ["city"],
    },
)
NOW = FunctionTool("now")
PARIS = ("get_weather", {"city": "Paris"})
BEGIN, END = "<\uff5ctool\u2581calls\u2581begin\uff5c>", "<\uff5ctool\u2581calls\u2581end\uff5c>"
CALL, CALL_END = "<\uff5ctool\u2581call\u2581begin\uff5c>", "<\uff5ctool\u2581call\u2581end\uff5c>"
SEP = "<\uff5ctool\u2581sep\uff5c>"

# (format, model text, content, [(name, arguments object)])
RECORDED: list[tuple[str, str, str, list[tuple[str, dict[str, Any]]]]] = [
    (
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
        '{"name": "now", "arguments": {}}]',
        "",
        [PARIS, ("now", {})],
    ),
    (
        "mistral",  # v11 on: name[ARGS]{...}, the control token before each call
        'Sure.[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]now[ARGS]{}',
        "Sure.",
        [PARIS, ("now", {})],
    ),
    ("mistral", "No call [here].", "No call [here].", []),
    (
        "granite",
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris"}}]',
        "",
        [PARIS],
    ),
    (
        "pythonic",
        '[get_weather(city="Paris", days=2), now()]',
        "",
        [("get_weather", {"city": "Paris", "days": 2}), ("now", {})],
    ),
    (
        "pythonic",
        '[get_weather(city=\'a]b"c)\', days=-1, metric=True, x=None, l=[1, {"k": false}])] ok',
        " ok",
        [
            (
                "get_weather",
                {"city": 'a]b"c)', "days": -1, "metric": True, "x": None, "l": [1, {"k": False}]},
            )
        ],
    ),
    # Blanks after the list are no content, streamed or not (the OpenAI Agents SDK made a
    # message of them beside the call); text after them keeps them.
    ("pythonic", "[now()]\n\t\n\r\n ", "", [("now", {})]),
    ("pythonic", "[now()]\n \nDone.", "\n \nDone.", [("now", {})]),
    ("pythonic", "[1, 2] are numbers", "[1, 2] are numbers", []),
    ("pythonic", "Hello [x]", "Hello [x]", []),
    (
        "qwen3_coder",
        "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
        "</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=now>\n</function>\n</tool_call>",
        "Let me check.\n",
        [("get_weather", {"city": "Paris", "days": 2}), ("now", {})],
    ),
    (
        "qwen3_coder",  # a string parameter stays text, even when it reads as a number
        "<tool_call>\n<function=get_weather>\n<parameter=city>\n1 < 2\n</parameter>\n"
        "</function>\n</tool_call>",
        "",
        [("get_weather", {"city": "1 < 2"})],
    ),
    ("qwen3_coder", "<tool_call>hello</tool_call> bye", "<tool_call>hello</tool_call> bye", []),
    (
        "deepseek_v3",
        f'{BEGIN}{CALL}function{SEP}get_weather\n```json\n{{"city": "Paris"}}\n```{CALL_END}\n'
        f"{CALL}function{SEP}now\n```json\n{{}}\n```{CALL_END}{END}",
        "",
        [PARIS, ("now", {})],
    ),
    (
        "deepseek_v3",  # V3.1's shorter form
        f'Ok {BEGIN}{CALL}get_weather{SEP}{{"city": "Paris"}}{CALL_END}{END}',
        "Ok ",
        [PARIS],
    ),
    (
        "openai",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": '
        '"Paris"}',
        "",
        [PARIS],
    ),
    (
        "openai",
        "<|start|>assistant<|channel|>commentary to=functions.now<|message|>{}<|call|>",
        "",
        [("now", {})],
    ),
    ("openai", "<|channel|>final<|message|>It is sunny.", "It is sunny.", []),
]


def feed_in(parser: Any, pieces: list[str]) -> tuple[str, list[Any]]:
    content, deltas = [], []
    for piece in pieces:
        c, d = parser.feed(piece)
        content.append(c)
        deltas += d
    c, d = parser.end()
    return "".join(content) + c, deltas + d


def new_parser(format: str) -> Any:
    tools = [WEATHER, NOW]
    return plan_tools(tools, "auto", None, [], chat_template=None, parser=format).new_parser()


@pytest.mark.parametrize(("format", "text", "content", "calls"), RECORDED)
def test_each_format_parses_the_same_however_the_text_is_split(
    format: str, text: str, content: str, calls: list[tuple[str, dict[str, Any]]]
) -> None:
    cuts = [[text], list(text)] + [[text[:i], text[i:]] for i in range(1, len(text))]
    for pieces in cuts:
        parser = new_parser(format)
        streamed, deltas = feed_in(parser, pieces)
        whole, found = parser.finish()
        assert streamed == whole == content, pieces
        assert [(c.name, json.loads(c.arguments)) for c in found] == calls, pieces
        starts = [d for d in deltas if d.id is not None]
        assert [(d.index, d.id, d.name) for d in starts] == [
            (i, c.id, c.name) for i, c in enumerate(found)
        ]
        for i, call in enumerate(found):
            assert "".join(d.arguments for d in deltas if d.index == i) == call.arguments
            if format == "mistral":
                assert re.fullmatch("[A-Za-z0-9]{9}", call.id)
            else:
                assert call.id.startswith("call_")


@pytest.mark.parametrize("format", sorted(TEMPLATES))
def test_auto_picks_each_format_from_its_template(format: str) -> None:
    assert pick_format("auto", TEMPLATES[format]) is FORMATS[format]


# -- grammars ---------------------------------------------------------------------------------

# What each format's grammar must accept (forced, a call to get_weather) and a near miss.
GRAMMAR_CASES = {
    "mistral": (
        '[TOOL_CALLS][{"name":"get_weather","arguments":{"city":"Paris"}}]',
        '[TOOL_CALLS][{"name":"get_weather","arguments":{}}]',
    ),
    "granite": (
        '<|tool_call|>[{"name":"get_weather","arguments":{"city":"Paris"}}]',
        "<|tool_call|>{}",
    ),
    "pythonic": ('[get_weather(city="Paris", metric=True)]', "[get_weather(city=Paris)]"),
    "qwen3_coder": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=get_weather>\n</function>\n</tool_call>",
    ),
    "deepseek_v3": (
        f'{BEGIN}{CALL}function{SEP}get_weather\n```json\n{{"city":"Paris"}}\n```{CALL_END}{END}',
        f"{BEGIN}{CALL}function{SEP}get_weather\n```json\n{{}}\n```{CALL_END}{END}",
    ),
    "openai": (
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city":"P"}',
        "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{}",
    ),
}


@pytest.fixture(scope="module")
def accepts(default_model: Any) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(default_model.path)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    eos = [tokenizer.eos_token_id]
    llg = grammar_vocabulary(tokenizer, len(tokenizer), eos).tokenizer

    def check(grammar: str, text: str) -> bool:
        m = LLMatcher(llg, LLMatcher.grammar_from_lark(grammar))
        ids = tokenizer.encode(text, add_special_tokens=False)
        return all(m.consume_token(t) for t in ids) and m.is_accepting()

    return check


@pytest.mark.parametrize("format", sorted(GRAMMAR_CASES))
def test_each_format_grammar_takes_a_call_and_refuses_a_bad_one(accepts: Any, format: str) -> None:
    good, bad = GRAMMAR_CASES[format]
    for forced, parallel in ((True, False), (True, True), (False, True)):
        grammar = tool_grammar(FORMATS[format], [WEATHER, NOW], forced=forced, parallel=parallel)
        assert LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) == ""
        assert accepts(grammar, good), (forced, parallel)
        assert not accepts(grammar, bad), (forced, parallel)
    lazy = tool_grammar(FORMATS[format], [WEATHER, NOW], forced=False, parallel=True)
    assert accepts(lazy, "No call needed.")


def test_mistral_v11_templates_get_the_name_args_form(accepts: Any) -> None:
    plan = plan_tools(
        [WEATHER], NamedFunction("get_weather"), None, [], chat_template=TEMPLATES["mistral"]
    )
    assert plan.constraint is not None and plan.keeps_special
    assert accepts(plan.constraint.spec, '[TOOL_CALLS]get_weather[ARGS]{"city":"Paris"}')
    assert not accepts(plan.constraint.spec, '[TOOL_CALLS][{"name":"get_weather"}]')


# -- per-model options ------------------------------------------------------------------------


def test_a_model_entry_names_its_own_formats_and_template(tmp_path: Any) -> None:
    from trio_llm.config import EngineArgs
    from trio_llm.http.model_specs import ModelSpecError, model_specs

    template = tmp_path / "t.jinja"
    template.write_text(TEMPLATES["mistral"])
    entries = [f"/m:name=a,tools=mistral,reasoning=mistral,chat-template={template}", "/m:name=b"]
    a, b = model_specs(entries, EngineArgs(), replicas=1)
    assert (a.args.tool_call_parser, a.args.reasoning_parser) == ("mistral", "mistral")
    assert a.args.chat_template == str(template)
    assert (b.args.tool_call_parser, b.args.reasoning_parser, b.args.chat_template) == (
        None,
        None,
        None,
    )
    from trio_llm.http.serve_flags import parse_serve_args

    other = tmp_path / "other.jinja"
    other.write_text("{{ messages }}")
    argv = [f"/m:name=a,chat-template={template}", "/m:name=b", "--chat-template", str(other)]
    own, server_wide = parse_serve_args(argv).model_specs
    assert (own.args.chat_template, server_wide.args.chat_template) == (str(template), str(other))
    with pytest.raises(SystemExit):
        parse_serve_args(["/m", "--chat-template", str(tmp_path / "missing.jinja")])
    for bad, words in (
        ("/m:tools=nope", "tools must be one of"),
        ("/m:reasoning=nope", "reasoning must be one of"),
        (f"/m:chat-template={tmp_path}/missing.jinja", "is not a file"),
    ):
        with pytest.raises(ModelSpecError, match=words):
            model_specs([bad], EngineArgs(), replicas=1)


def test_a_model_s_own_formats_win_over_the_server_s() -> None:
    from types import SimpleNamespace

    from trio_llm.http.generate.prompt import OutputFormats

    server = OutputFormats("auto", "auto")
    own = SimpleNamespace(tool_call_parser="pythonic", reasoning_parser=None)
    assert server.of_model(own) == OutputFormats("pythonic", "auto")
    assert server.of_model(object()) == server


@pytest.mark.parametrize("format", sorted(FORMATS))
def test_an_earlier_call_is_written_back_as_the_parser_reads_it(format: str) -> None:
    """For a template without tools the server writes earlier calls itself, in the format."""
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}]
    text = FORMATS[format].render_calls(calls)
    parser = new_parser(format)
    parser.feed(text)
    content, found = parser.finish()
    assert content == ""
    assert [(c.name, json.loads(c.arguments)) for c in found] == [
        ("get_weather", {"city": "Paris", "days": 2})
    ]


@pytest.mark.parametrize("format", ["deepseek_v3", "openai"])
def test_json_arguments_stream_as_they_are_written(format: str) -> None:
    """DeepSeek's and Harmony's calls start at their head; the arguments follow piece by piece
    (Qwen3-Coder's, typed by the schema, come whole)."""
    text = next(t for f, t, _, calls in RECORDED if f == format and calls)
    parser = new_parser(format)
    fed = [parser.feed(c)[1] for c in text]
    pieces = [d for step in fed for d in step]
    first = next(i for i, step in enumerate(fed) if step)
    assert pieces[0].name == "get_weather" and pieces[0].arguments == ""
    assert text[: first + 1].endswith(("\n```json\n{", "<|message|>{"))
    assert len([d for d in pieces if d.index == 0 and d.arguments]) > 5
