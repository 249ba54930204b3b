"""Tool calling without a model: the streaming parser on recorded outputs of several formats
(split at every point), the grammars against llguidance, the tool prompt, and the wire (the
OpenAI SDK over a fake engine that writes scripted answers)."""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from http_fake_engine import FakeEngine
from llguidance import LLMatcher
from transformers import AutoTokenizer

from trio_llm.constraint import Constraint
from trio_llm.grammar import grammar_vocabulary
from trio_llm.http import ServerConfig, build_app
from trio_llm.http.errors import ProtocolError
from trio_llm.http.tools import (
    FORMATS,
    FunctionTool,
    NamedFunction,
    ToolCallParser,
    pick_format,
    plan_tools,
    template_takes_tools,
)
from trio_llm.http.tools import parser as parser_module
from trio_llm.http.tools.formats import HERMES, LLAMA3_JSON, ToolFormat, UnknownToolFormat
from trio_llm.http.tools.grammar import closed, tool_grammar

WEATHER = FunctionTool(
    "get_weather",
    "The weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
NOW = FunctionTool("now")

# Outputs as models write them: (format, text, content, [(name, arguments object)]).
RECORDED = [
    (
        "hermes",  # SmolLM2: a list in one tag
        '<tool_call>[\n{"name": "get_weather", "arguments": {"city": "Paris"}},\n'
        '{"name": "now", "arguments": {}}\n]</tool_call>',
        "",
        [("get_weather", {"city": "Paris"}), ("now", {})],
    ),
    (
        "hermes",  # Qwen/Hermes: text, then one tag per call
        'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", '
        '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
        "Let me check.\n",  # the newline between the calls is not content
        [("get_weather", {"city": "Oslo", "days": 2}), ("now", {})],
    ),
    (
        "hermes",  # braces and tags inside strings, arguments before the name
        '<tool_call>{"arguments": {"city": "a}b</tool_call"}, "name": "get_weather"}</tool_call>'
        " done",
        " done",
        [("get_weather", {"city": "a}b</tool_call"})],
    ),
    (
        "hermes",
        "No tools needed: 1 < 2 and <b>bold</b>.",
        "No tools needed: 1 < 2 and <b>bold</b>.",
        [],
    ),
    ("hermes", "<tool_call>hello</tool_call> bye", "<tool_call>hello</tool_call> bye", []),
    ("hermes", "<tool_call>[]</tool_call>", "", []),
    (
        "llama3_json",
        '{"name": "get_weather", "parameters": {"city": "Rome"}}; '
        '{"name": "now", "parameters": {}}',
        "",
        [("get_weather", {"city": "Rome"}), ("now", {})],
    ),
    ("llama3_json", "Rome is sunny {today}.", "Rome is sunny {today}.", []),
]


def feed_in(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[Any]]:
    content, deltas = [], []
    for piece in pieces:
        c, d = parser.feed(piece)
        content.append(c)
        deltas += d
    c, d = parser.end()
    return "".join(content) + c, deltas + d


def splits(text: str) -> list[list[str]]:
    """The text whole, a character at a time, cut at every single point, and at random."""
    rng = random.Random(len(text))
    out = [[text], list(text)]
    out += [[text[:i], text[i:]] for i in range(1, len(text))]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(text)), min(5, len(text) - 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


@pytest.mark.parametrize(("format", "text", "content", "calls"), RECORDED)
def test_recorded_outputs_parse_the_same_however_they_are_split(
    format: str, text: str, content: str, calls: list[tuple[str, dict]]
) -> None:
    for pieces in splits(text):
        parser = ToolCallParser(FORMATS[format])
        streamed, deltas = feed_in(parser, pieces)
        whole, found = parser.finish()
        assert streamed == whole == content, pieces
        assert [(c.name, json.loads(c.arguments)) for c in found] == calls, pieces
        # The first delta of each call has its index, id and name; the fragments concatenate.
        starts = [d for d in deltas if d.id is not None]
        assert [(d.index, d.id, d.name) for d in starts] == [
            (i, c.id, c.name) for i, c in enumerate(found)
        ]
        for i, call in enumerate(found):
            assert "".join(d.arguments for d in deltas if d.index == i) == call.arguments
            assert call.id.startswith("call_")


def test_a_possible_tag_start_is_held_back_until_it_is_known() -> None:
    parser = ToolCallParser(HERMES)
    assert parser.feed("Hi <tool") == ("Hi ", [])
    assert parser.feed("_c") == ("", [])
    assert parser.feed("at") == ("<tool_cat", [])
    assert parser.feed(" <") == (" ", [])
    assert parser.end() == ("<", [])


def test_whitespace_after_calls_is_no_content_and_text_after_it_keeps_it() -> None:
    call = '<tool_call>{"name": "now", "arguments": {}}</tool_call>'
    parser = ToolCallParser(HERMES)
    assert parser.feed(call + "\n")[0] == ""
    assert parser.feed("\n")[0] == ""
    assert parser.end() == ("", [])
    assert parser.finish()[0] == ""
    parser = ToolCallParser(HERMES)
    assert parser.feed(call + "\n")[0] == ""
    assert parser.feed("Done.")[0] == "\nDone."
    parser = ToolCallParser(HERMES)
    parser.feed("\n" + call + "\n" + call + " ")
    content, calls = parser.finish()
    assert (content, len(calls)) == ("\n", 2)  # text before the calls is the model's


def test_arguments_stream_as_the_model_writes_them() -> None:
    parser = ToolCallParser(HERMES)
    pieces = [
        '<tool_call>{"name": "get_weather", ',
        '"arguments": {"city": "Pa',
        'ris"}}',
        "</tool_call>",
    ]
    seen = [parser.feed(p)[1] for p in pieces]
    assert seen[0] == []  # the arguments' key is not there yet
    [start, first] = seen[1]
    assert (start.name, start.arguments, first.arguments) == ("get_weather", "", '{"city": "Pa')
    # The object is complete at its last brace: the arguments end there, the tag adds nothing.
    assert [d.arguments for d in seen[2]] == ['ris"}']
    assert seen[3] == []


def _write_file_output(size: int) -> tuple[str, str]:
    code = ("def f(x):\n    return {'a': [x, \"}\"]}\n" * (size // 40 + 1))[:size]
    arguments = json.dumps({"path": "a.py", "content": code})
    return '<tool_call>{"name": "write_file", "arguments": ' + arguments + "}</tool_call>", code


def test_streamed_arguments_cost_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A write_file call with 80 KB of code, fed as a model writes it (a few characters at a
    time): the characters the parser walks and decodes stay a small multiple of the output
    (before, the call object was decoded again at every `}`: quadratic, 8 times longer from
    20 to 80 KB). Counted, not timed, so that a loaded machine cannot fail it."""
    work = {"walked": 0, "decoded": 0}
    advance = parser_module._Pending.advance
    raw_decode = json.JSONDecoder.raw_decode
    partial = parser_module.partial_json_parser.loads

    def counted_advance(self: Any, region: str, upto: int) -> None:
        work["walked"] += max(0, upto - max(self.scanned, self.start))
        advance(self, region, upto)

    def counted_raw_decode(self: Any, text: str, idx: int = 0) -> Any:
        work["decoded"] += len(text) - idx
        return raw_decode(self, text, idx)

    def counted_partial(text: str, *args: Any) -> Any:
        work["decoded"] += len(text)
        return partial(text, *args)

    monkeypatch.setattr(parser_module._Pending, "advance", counted_advance)
    monkeypatch.setattr(json.JSONDecoder, "raw_decode", counted_raw_decode)
    monkeypatch.setattr(parser_module.partial_json_parser, "loads", counted_partial)
    large, code = _write_file_output(80_000)
    parser = ToolCallParser(HERMES)
    content, deltas = feed_in(parser, [large[i : i + 4] for i in range(0, len(large), 4)])
    arguments = json.loads("".join(d.arguments for d in deltas))
    assert content == "" and arguments["content"] == code
    assert work["walked"] <= len(large), work
    assert work["decoded"] <= 3 * len(large), work  # the object once, its arguments once


def test_a_call_cut_off_keeps_what_was_written() -> None:
    parser = ToolCallParser(HERMES)
    parser.feed('Sure <tool_call>{"name": "now", "arguments": {"a": "b')
    content, [call] = parser.finish()
    assert (content, call.name, call.arguments) == ("Sure ", "now", '{"a": "b')


# -- grammars ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def matcher(default_model: Any) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(default_model.path)
    llg = grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id]).tokenizer

    def accepts(grammar: str, text: str) -> bool:
        m = LLMatcher(llg, LLMatcher.grammar_from_lark(grammar))
        return all(m.consume_token(t) for t in tokenizer.encode(text)) and m.is_accepting()

    return accepts


CALL = '<tool_call>[{"name":"get_weather","arguments":{"city":"Paris"}}]</tool_call>'
TWO = (
    '<tool_call>[{"name":"get_weather","arguments":{"city":"P"}},'
    '{"name":"now","arguments":{}}]</tool_call>'
)


@pytest.mark.parametrize(
    ("forced", "parallel", "text", "accepted"),
    [
        (True, True, CALL, True),
        (True, True, TWO, True),
        (True, False, TWO, False),
        (True, True, "Hello", False),
        (
            True,
            True,
            '<tool_call>[{"name":"get_weather","arguments":{"town":"P"}}]</tool_call>',
            False,
        ),
        (True, True, '<tool_call>[{"name":"other","arguments":{}}]</tool_call>', False),
        (False, True, "Hello, no call.", True),
        (False, True, "Let me see. " + CALL, True),
        (
            False,
            True,
            'Let me see. <tool_call>{"name":"get_weather","arguments":{"city":1}}',
            False,
        ),
        (False, True, "<tool_call>[]</tool_call>", True),
        (False, False, TWO, False),
    ],
)
def test_hermes_grammar(
    matcher: Any, forced: bool, parallel: bool, text: str, accepted: bool
) -> None:
    grammar = tool_grammar(HERMES, [WEATHER, NOW], forced=forced, parallel=parallel)
    assert LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) == ""
    assert matcher(grammar, text) is accepted


@pytest.mark.parametrize(("forced", "parallel"), [(True, True), (True, False), (False, True)])
@pytest.mark.parametrize("after", [" ", "\n", "\n\n", " Done, it is sunny."])
def test_whitespace_or_text_after_the_last_call_can_end_the_answer(
    matcher: Any, forced: bool, parallel: bool, after: str
) -> None:
    """Before, a space after `</tool_call>` opened another call that never came: EOS stayed
    masked until max_tokens. A forced answer (required, a named function) is calls and
    whitespace only: text after them is refused, so the model ends instead of talking on."""
    accepted = not forced or after.isspace()
    grammar = tool_grammar(HERMES, [WEATHER, NOW], forced=forced, parallel=parallel)
    assert matcher(grammar, CALL + after) is accepted
    llama3 = tool_grammar(LLAMA3_JSON, [WEATHER, NOW], forced=forced, parallel=parallel)
    assert matcher(llama3, '{"name":"now","parameters":{}}' + after) is accepted


def test_a_second_call_after_text_is_still_constrained(matcher: Any) -> None:
    grammar = tool_grammar(HERMES, [WEATHER, NOW], forced=False, parallel=True)
    bad = '<tool_call>{"name":"get_weather","arguments":{"city":1}}</tool_call>'
    assert matcher(grammar, CALL + "\nAnd now:\n" + CALL)
    assert not matcher(grammar, CALL + "\nAnd now:\n" + bad)
    single = tool_grammar(HERMES, [WEATHER, NOW], forced=False, parallel=False)
    assert not matcher(single, CALL + "\n" + CALL)
    forced = tool_grammar(HERMES, [WEATHER, NOW], forced=True, parallel=True)
    assert matcher(forced, CALL + "\n" + CALL + "\n")
    assert not matcher(forced, CALL + "\n" * 9)  # then only the end: no blank lines to max_tokens
    assert not matcher(forced, CALL + "\nAnd now:\n" + CALL)
    assert not matcher(forced, CALL + "\n" + bad)
    assert not matcher(
        tool_grammar(HERMES, [WEATHER, NOW], forced=True, parallel=False), CALL + "\n" + CALL
    )


ANSWER = Constraint.json_schema(
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
)


@pytest.mark.parametrize("format", [HERMES, LLAMA3_JSON])
def test_auto_with_an_answer_format_allows_a_call_or_that_answer(
    matcher: Any, format: ToolFormat
) -> None:
    """What the OpenAI Agents SDK sends with an output_type: tools, tool_choice auto and a
    response_format. Before, the tools' grammar was dropped and no call could be made."""
    grammar = tool_grammar(format, [WEATHER, NOW], forced=False, parallel=True, answer=ANSWER)
    call = CALL if format is HERMES else '{"name":"now","parameters":{}}'
    assert matcher(grammar, call)
    assert matcher(grammar, '{"city":"Oslo"}')
    assert not matcher(grammar, '{"town":"Oslo"}')
    assert not matcher(grammar, "Oslo is nice.")
    for answer in (
        Constraint.json_object(),
        Constraint.regex("[0-9]+/[a-z]"),
        Constraint.choice(["yes"]),
    ):
        assert (
            LLMatcher.validate_grammar(
                LLMatcher.grammar_from_lark(
                    tool_grammar(format, [NOW], forced=False, parallel=True, answer=answer)
                )
            )
            == ""
        )


def test_plan_tools_offers_the_answer_beside_the_calls_or_gives_way() -> None:
    messages = HISTORY[:2]
    auto = plan_tools([WEATHER], "auto", None, messages, chat_template=SMOLLM2, answer=ANSWER)
    assert auto.constraint is not None and "answer: %json" in auto.constraint.spec
    required = plan_tools(
        [WEATHER], "required", None, messages, chat_template=SMOLLM2, answer=ANSWER
    )
    assert required.constraint is not None and "answer" not in required.constraint.spec
    none = plan_tools([WEATHER], "none", None, messages, chat_template=SMOLLM2, answer=ANSWER)
    assert none.constraint is ANSWER
    with pytest.raises(ProtocolError) as refused:
        plan_tools(
            [WEATHER], "auto", None, messages, chat_template=SMOLLM2,
            answer=Constraint.grammar('start: "x"'),
        )  # fmt: skip
    assert (refused.value.status, refused.value.param) == (400, "tool_choice")


KIMI_LIKE = (
    "{%- if tools %}{{ tools | tojson }}{%- endif %}"
    "{%- for m in messages %}{%- if m.tool_calls %}<|tool_calls_section_begin|>"
    "{{ m.tool_calls | tojson }}{%- else %}{{ m.content }}{%- endif %}{%- endfor %}"
)


def test_auto_refuses_tools_in_a_call_format_it_does_not_read() -> None:
    """Before, any template auto did not recognise was served as hermes: the model, shown the
    tools by its own template, wrote calls the parser never saw."""
    for template, words in (
        (KIMI_LIKE, "Kimi K2's"),
        ("{% for t in tools %}{{ t.name }}{% endfor %}{{ messages }}", "no call format"),
    ):
        with pytest.raises(UnknownToolFormat, match="--tool-call-parser"):
            pick_format("auto", template)
        with pytest.raises(ProtocolError) as refused:
            plan_tools([WEATHER], "auto", None, HISTORY[:2], chat_template=template)
        assert refused.value.param == "tools" and words in refused.value.message
        assert "--tool-call-parser" in refused.value.message
        # Without tools in play the template still renders the history itself.
        assert plan_tools([], None, None, HISTORY, chat_template=template).constraint is None
    assert pick_format("hermes", KIMI_LIKE) is HERMES
    assert pick_format("auto", SMOLLM2) is HERMES  # no tools in it: the server's own prompt


def test_tool_grammars_are_built_once_per_content(monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_llm.http.tools import grammar

    built = []
    real = grammar._build

    def counting(*args: Any) -> str:
        built.append(args)
        return real(*args)

    monkeypatch.setattr(grammar, "_build", counting)
    monkeypatch.setattr(grammar, "_grammars", OrderedDict())
    again = FunctionTool(
        WEATHER.name, WEATHER.description, json.loads(json.dumps(WEATHER.parameters))
    )
    first = plan_tools([WEATHER, NOW], "auto", None, HISTORY, chat_template=SMOLLM2)
    second = plan_tools([again, NOW], "auto", None, HISTORY, chat_template=SMOLLM2)
    assert first.constraint == second.constraint and len(built) == 1
    plan_tools([WEATHER], "auto", None, HISTORY, chat_template=SMOLLM2)
    assert len(built) == 2


def test_llama3_json_grammar(matcher: Any) -> None:
    forced = tool_grammar(LLAMA3_JSON, [WEATHER, NOW], forced=True, parallel=True)
    lazy = tool_grammar(LLAMA3_JSON, [WEATHER, NOW], forced=False, parallel=True)
    call = '{"name":"get_weather","parameters":{"city":"Rome"}}; {"name":"now","parameters":{}}'
    assert matcher(forced, call) and matcher(lazy, call)
    assert matcher(lazy, "It is sunny.") and not matcher(forced, "It is sunny.")
    assert not matcher(lazy, '{"name":"nope","parameters":{}}')


# -- prompting and planning -------------------------------------------------------------------

SMOLLM2 = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ '<|im_end|>' + '\\n'}}{% endfor %}"
)
QWEN_LIKE = (
    "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>{% endif %}"
    "{% for m in messages %}{{ m.role }}: {{ m.content }}<tool_call>{% endfor %}"
)


def test_templates_that_take_tools_are_told_apart() -> None:
    assert not template_takes_tools(SMOLLM2)
    assert template_takes_tools(QWEN_LIKE)
    assert not template_takes_tools("{# tools #}{{ messages }}")  # a mention is not a use
    assert pick_format("auto", QWEN_LIKE) is HERMES
    assert pick_format("auto", "<|python_tag|>{{ messages }}") is LLAMA3_JSON
    assert pick_format("llama3_json", QWEN_LIKE) is LLAMA3_JSON


HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "content": '{"sky": "sunny"}', "tool_call_id": "call_1"},
]


def test_a_template_without_tools_gets_the_tool_block_and_the_history_written_out() -> None:
    plan = plan_tools([WEATHER], "auto", None, HISTORY, chat_template=SMOLLM2)
    system, user, assistant, tool = plan.messages
    assert system["content"].startswith("Be brief.\n\nYou are an expert in composing functions")
    assert '<tools>[{"name": "get_weather"' in system["content"]
    assert user == HISTORY[1]
    assert assistant == {
        "role": "assistant",
        "content": '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]'
        "</tool_call>",
    }
    assert tool == {
        "role": "tool",
        "content": '<tool_response>\n{"sky": "sunny"}\n</tool_response>',
    }
    assert plan.template_kwargs == {} and plan.constraint is not None
    assert plan.new_parser() is not None


def test_a_template_with_tools_gets_them_and_the_calls_as_objects() -> None:
    plan = plan_tools([WEATHER], "required", False, HISTORY, chat_template=QWEN_LIKE)
    assert plan.messages[0] == HISTORY[0]
    assert plan.messages[2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert plan.template_kwargs["tools"][0]["function"]["name"] == "get_weather"


def test_none_shows_no_tools_and_reads_no_calls() -> None:
    plan = plan_tools([WEATHER], "none", None, HISTORY, chat_template=SMOLLM2)
    assert "<tools>" not in plan.messages[0]["content"]
    assert plan.constraint is None and plan.new_parser() is None


def test_a_named_function_forces_that_one() -> None:
    plan = plan_tools([WEATHER, NOW], NamedFunction("now"), None, HISTORY[:2], chat_template=None)
    assert plan.constraint is not None
    assert "now" in plan.constraint.spec and "get_weather" not in plan.constraint.spec


# -- the wire, over a fake engine -------------------------------------------------------------

SCRIPTED = (
    'Checking. <tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
)
TOOLS = [{"type": "function", "function": {"name": WEATHER.name, "parameters": WEATHER.parameters}}]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(max_model_len=4096, outputs=[SCRIPTED, "Just text, <b>no</b> call."])


@pytest.fixture
async def sdk(engine: FakeEngine, serve_app: Any) -> AsyncIterator[openai.AsyncOpenAI]:
    url = await serve_app(build_app(engine, config=ServerConfig()))
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0) as client:
        yield client


async def ask(sdk: openai.AsyncOpenAI, **extra: Any) -> Any:
    request = {"model": "fake-model", "messages": HISTORY[:2], "tools": TOOLS, **extra}
    return await sdk.chat.completions.create(**request)


async def test_the_reply_carries_tool_calls(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    reply = await ask(sdk, n=2, tool_choice="required")
    first, second = reply.choices
    assert (first.finish_reason, first.message.content) == ("tool_calls", "Checking. ")
    [call] = first.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Paris"}')
    assert (second.finish_reason, second.message.tool_calls) == ("stop", None)
    assert second.message.content == "Just text, <b>no</b> call."
    [params] = engine.params.values()
    assert params.constraint is not None and "get_weather" in params.constraint.spec
    [prompt] = engine.prompts.values()
    assert "<tools>" in "".join(map(chr, prompt))


async def test_streamed_calls_arrive_as_openai_deltas(sdk: openai.AsyncOpenAI) -> None:
    stream = await ask(sdk, stream=True, n=2)
    content: dict[int, str] = {0: "", 1: ""}
    calls: dict[int, list[Any]] = {0: [], 1: []}
    finish = {}
    async for chunk in stream:
        for choice in chunk.choices:
            content[choice.index] += choice.delta.content or ""
            calls[choice.index] += choice.delta.tool_calls or []
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert "<" not in content[0] and content[0] == "Checking. "
    assert content[1] == "Just text, <b>no</b> call."
    assert finish == {0: "tool_calls", 1: "stop"} and calls[1] == []
    head, *rest = calls[0]
    assert (head.index, head.type, head.function.name) == (0, "function", "get_weather")
    assert head.id.startswith("call_") and all(d.id is None and d.index == 0 for d in rest)
    arguments = (head.function.arguments or "") + "".join(d.function.arguments for d in rest)
    assert json.loads(arguments) == {"city": "Paris"}


async def test_tool_choice_none_sends_no_tools_and_parses_nothing(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    reply = await ask(sdk, tool_choice="none")
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == SCRIPTED
    [params] = engine.params.values()
    [prompt] = engine.prompts.values()
    assert params.constraint is None and "<tools>" not in "".join(map(chr, prompt))


def test_openapi_shows_the_tool_fields() -> None:
    from trio_llm.http.ops.openapi import openapi_document

    schemas = openapi_document("x")["components"]["schemas"]
    fields = schemas["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls"} <= set(fields)
    assert schemas["ChatTool"]["required"] == ["type", "function"]
    assert set(schemas["FunctionDefinition"]["properties"]) == {
        "name",
        "description",
        "parameters",
        "strict",
    }
    assert {"tool_calls", "tool_call_id"} <= set(schemas["ChatMessage"]["properties"])
    assert "tool_calls" in schemas["ChatMessageOut"]["properties"]
    assert "tool_calls" in schemas["ChatDelta"]["properties"]


def test_arguments_hold_only_the_listed_keys() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer"}}}},
        "$defs": {"D": {"type": "object", "properties": {}}},
    }
    out = closed(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert closed({"type": "object", "additionalProperties": True}) == {
        "type": "object",
        "additionalProperties": True,
    }
    assert "additionalProperties" not in schema  # the tool's own schema is left alone
