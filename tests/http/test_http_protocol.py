"""The OpenAI protocol layer with plain values: decoding, validation, response and SSE shapes."""

from __future__ import annotations

import json

import pytest

from trio_llm.http.chat.build import ChatStream, chat_response
from trio_llm.http.chat.plan import plan_chat
from trio_llm.http.chat.protocol import ChatCompletionRequest
from trio_llm.http.choices import Shape
from trio_llm.http.completions.build import CompletionStream, completion_response
from trio_llm.http.completions.plan import plan_completion
from trio_llm.http.completions.protocol import CompletionRequest
from trio_llm.http.conversation import IMAGE_MARKER, ImageRef
from trio_llm.http.errors import ProtocolError
from trio_llm.http.generate.streams import merge_final
from trio_llm.http.logprobs import token_bytes
from trio_llm.http.sampling import RequestLimits, SamplingDefaults, Truncation, check_token_ids
from trio_llm.http.sse import SSE_DONE, sse_event
from trio_llm.http.wire import decode_request
from trio_llm.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from trio_llm.sampling_params import RequestOutputKind

LIMITS = RequestLimits()


def chat(**fields: object) -> ChatCompletionRequest:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    return decode_request(json.dumps(body).encode(), ChatCompletionRequest)


def completion(**fields: object) -> CompletionRequest:
    body = {"model": "m", "prompt": "hi", **fields}
    return decode_request(json.dumps(body).encode(), CompletionRequest)


def error_of(fn, *args: object) -> ProtocolError:  # type: ignore[no-untyped-def]
    with pytest.raises(ProtocolError) as info:
        fn(*args)
    return info.value


def output(
    *choices: CompletionOutput,
    prompt: list[int] | None = None,
    finished: bool = False,
    prompt_logprobs: list[PositionLogprobs | None] | None = None,
) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt=None,
        prompt_token_ids=prompt if prompt is not None else [1, 2, 3],
        outputs=list(choices),
        finished=finished,
        metrics=RequestMetrics(arrival_time=0.0),
        prompt_logprobs=prompt_logprobs,
    )


def lp(text: str, value: float, *top: tuple[str, float]) -> PositionLogprobs:
    return PositionLogprobs(
        Logprob(0, value, 1, text), [Logprob(0, v, i + 1, t) for i, (t, v) in enumerate(top)]
    )


# -- decoding ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param", "fragment"),
    [
        (b"{not json", None, "Invalid JSON"),
        (b'{"messages": [{"role": "user", "content": "\xff"}]}', None, "UTF-8"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None, "Invalid JSON"),
        (b'{"messages": "hi"}', "messages", "Expected `array`"),
        (b'{"messages": [], "max_tokens": "5"}', "max_tokens", "Expected `int | null`"),
        (b'{"messages": [], "max_tokens": 99999999999999999999}', "max_tokens", "<="),
        (b'{"messages": [], "n": 0}', "n", ">= 1"),
        (b'{"messages": [], "temperature": 1e999}', "temperature", "out of range"),
        (b'{"messages": [{"role": "", "content": "x"}]}', "messages[0].role", "length >= 1"),
        (b'{"messages": [], "logit_bias": {"abc": 1}}', "logit_bias", "int"),
        (b'{"messages": [], "top_logprobs": 21}', "top_logprobs", "<= 20"),
        (b"{}", "messages", "messages: this field is required"),
        (b"[" * 50000 + b"]" * 50000, None, "Invalid"),
    ],
)
def test_bad_bodies_are_400_naming_the_param(body: bytes, param: str | None, fragment: str) -> None:
    error = error_of(decode_request, body, ChatCompletionRequest)
    assert error.status == 400
    assert error.type == "invalid_request_error"
    assert error.param == param
    assert fragment in error.message
    if param is not None:  # the message names the field too, first
        assert error.message.startswith(f"Invalid request: {param}: ")


def test_a_bad_key_is_named_as_a_key() -> None:
    body = b'{"messages": [], "logit_bias": {"not_a_token_id": 1}}'
    error = error_of(decode_request, body, ChatCompletionRequest)
    assert error.param == "logit_bias"
    assert error.message.startswith(
        'Invalid request: logit_bias: the key "not_a_token_id" is not a token id; keys must be '
        "token ids"
    )
    body = b'{"messages": [], "chat_template_kwargs": {"a": 1}, "logit_bias": {"-1": 1}}'
    assert "keys must be token ids" in error_of(decode_request, body, ChatCompletionRequest).message


def test_deeply_nested_values_are_a_400_not_a_crash() -> None:
    body = b'{"messages": [], "tools": [{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}]}"
    assert error_of(decode_request, body, ChatCompletionRequest).status == 400


def test_unknown_fields_are_ignored_and_logged_at_debug(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("DEBUG", logger="trio_llm.http.wire"):
        request = chat(store=True, metadata={"a": 1})
    assert request.messages[0].content == "hi"
    assert "metadata, store" in caplog.text


# -- chat -------------------------------------------------------------------------------------


def test_chat_maps_openai_and_vllm_fields_to_sampling_params() -> None:
    plan = plan_chat(
        chat(
            max_completion_tokens=7,
            temperature=0,
            top_p=0.5,
            n=2,
            stop="\n",
            seed=3,
            presence_penalty=0.1,
            frequency_penalty=0.2,
            logit_bias={"5": -100},
            logprobs=True,
            top_logprobs=2,
            stream=True,
            top_k=4,
            min_p=0.1,
            repetition_penalty=1.1,
            min_tokens=1,
            ignore_eos=True,
            stop_token_ids=[9],
            skip_special_tokens=False,
            include_stop_str_in_output=True,
        ),
        LIMITS,
    )
    p = plan.params
    assert (p.max_tokens, p.temperature, p.top_p, p.n, p.stop, p.seed) == (7, 0, 0.5, 2, ["\n"], 3)
    assert (p.presence_penalty, p.frequency_penalty, p.logit_bias) == (0.1, 0.2, {5: -100.0})
    assert (p.logprobs, plan.top_logprobs, p.top_k, p.min_p, p.repetition_penalty) == (
        2,
        2,
        4,
        0.1,
        1.1,
    )
    assert (p.min_tokens, p.ignore_eos, p.stop_token_ids) == (1, True, [9])
    assert (p.skip_special_tokens, p.include_stop_str_in_output) == (False, True)
    assert p.output_kind is RequestOutputKind.DELTA
    assert plan.max_tokens_param == "max_completion_tokens"


def test_chat_defaults() -> None:
    plan = plan_chat(chat(), LIMITS)
    assert plan.params.max_tokens is None  # up to the context
    assert plan.params.temperature == 1.0
    assert plan.params.output_kind is RequestOutputKind.FINAL_ONLY
    assert plan.top_logprobs is None
    assert plan.conversation.messages == [{"role": "user", "content": "hi"}]


def test_chat_messages_take_text_parts_and_developer_role() -> None:
    plan = plan_chat(
        chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
            ]
        ),
        LIMITS,
    )
    assert plan.conversation.messages == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "a\nb"},
    ]


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("fields", "param", "fragment"),
    [
        ({"functions": [{"name": "f"}]}, "functions", "not supported"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
            "tool_choice",
            "not among the tools",
        ),
        ({"tools": [TOOL, TOOL]}, "tools", "given twice"),
        (
            {
                "tools": [TOOL],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
            "cannot be combined",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id", "required"),
        (
            {"messages": [{"role": "user", "content": "x", "tool_calls": [CALL]}]},
            "messages[0].tool_calls",
            "only an assistant",
        ),
        ({"messages": [{"role": "function", "content": "x"}]}, "messages[0]", "not supported"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "video_url", "video_url": {"url": "x"}}]}
                ]
            },
            "messages[0].content[0]",
            "not supported",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages[0].content[0].image_url.url",
            "required",
        ),
        ({"messages": []}, "messages", "at least one"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "required"),
        ({"temperature": 101}, "temperature", "temperature"),
        ({"max_tokens": 0}, "max_tokens", ">= 1"),
        ({"n": 17}, "n", "at most 16"),
        ({"stop": ["x"] * 17}, "stop", "at most 16"),
        ({"stop": ["x" * 513]}, "stop", "512"),
        ({"stop": [""]}, "stop", "empty"),
        ({"logit_bias": {str(i): 1 for i in range(301)}}, "logit_bias", "300"),
        ({"logit_bias": {"1": 101}}, "logit_bias", "[-100, 100]"),
        ({"top_logprobs": 3}, "top_logprobs", "requires logprobs"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens", "must not exceed"),
        ({"continue_final_message": True}, "continue_final_message", "cannot both"),
    ],
)
def test_chat_rejections_name_the_param(fields: dict, param: str, fragment: str) -> None:
    def run() -> None:
        plan_chat(chat(**fields), LIMITS)

    error = error_of(run)
    assert (error.status, error.param) == (400, param)
    assert fragment in error.message


def test_image_parts_plan_as_markers_with_their_urls_in_order() -> None:
    """The plan does not know the model: each picture is a marker in its message's text and a
    reference naming its field; the prompt step swaps in the model's image token."""
    content = [
        {"type": "text", "text": "Compare"},
        {"type": "image_url", "image_url": {"url": "data:a"}},
        {"type": "image_url", "image_url": "http://b"},
    ]
    plan = plan_chat(chat(messages=[{"role": "user", "content": content}]), LIMITS)
    [message] = plan.conversation.messages
    assert message["content"] == f"Compare\n{IMAGE_MARKER}\n{IMAGE_MARKER}"
    assert plan.conversation.images == (
        ImageRef("data:a", "messages[0].content[1].image_url"),
        ImageRef("http://b", "messages[0].content[2].image_url"),
    )


def test_top_logprobs_at_openai_limit_is_accepted() -> None:
    plan = plan_chat(chat(logprobs=True, top_logprobs=20), LIMITS)
    assert (plan.params.logprobs, plan.top_logprobs) == (20, 20)


def test_text_response_format_and_none_tool_choice_ask_for_nothing() -> None:
    """Values that ask for what is the default anyway plan as if they were left out: no
    constraint, no tools, no call."""
    plan = plan_chat(chat(response_format={"type": "text"}, tool_choice="none", tools=[]), LIMITS)
    assert plan.params.constraint is None and plan.constraint_param is None
    assert (plan.conversation.tools, plan.conversation.tool_choice) == ([], "none")
    assert plan == plan_chat(chat(), LIMITS)


def test_tools_default_to_auto_and_history_keeps_calls_and_results() -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
    ]
    conversation = plan_chat(chat(tools=[TOOL], messages=messages), LIMITS).conversation
    assert conversation.tool_choice == "auto" and [t.name for t in conversation.tools] == ["f"]
    assert conversation.messages[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert conversation.messages[2] == {
        "role": "tool",
        "content": "sunny",
        "tool_call_id": "call_1",
    }


# -- completions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("a", ["a"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2], [[1, 2]]),
        ([[1], [2, 3]], [[1], [2, 3]]),
    ],
)
def test_completion_prompt_forms(prompt: object, expected: list) -> None:
    assert plan_completion(completion(prompt=prompt), LIMITS).prompts == expected


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"prompt": ""}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", [1]]}, "prompt"),
        ({"prompt": ["a", ""]}, "prompt[1]"),
        ({"prompt": ["a"] * 17}, "prompt"),
        ({"prompt": [-1]}, "prompt[0]"),
        ({"suffix": "x"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 21}, "logprobs"),
    ],
)
def test_completion_rejections(fields: dict, param: str) -> None:
    def run() -> None:
        plan_completion(completion(**fields), LIMITS)

    error = error_of(run)
    assert (error.status, error.param) == (400, param)


def test_completion_defaults_and_echo_logprobs() -> None:
    plan = plan_completion(completion(), LIMITS)
    assert plan.params.max_tokens == 16  # OpenAI's default for completions
    plan = plan_completion(completion(max_tokens=None, echo=True, logprobs=2), LIMITS)
    assert plan.params.max_tokens is None
    assert (plan.params.logprobs, plan.params.prompt_logprobs, plan.echo) == (2, 2, True)


def test_token_checks() -> None:
    error = error_of(check_token_ids, [1, 100], 100, "prompt")
    assert (error.status, error.param) == (400, "prompt")


# -- responses --------------------------------------------------------------------------------


def test_chat_response_shape() -> None:
    out = output(
        CompletionOutput(1, "b", [5], finish_reason="length"),
        CompletionOutput(
            0,
            "a",
            [4, 4],
            finish_reason="stop",
            logprobs=[lp("a", -0.5, ("a", -0.5), ("z", -2.0))] * 2,
        ),
        finished=True,
    )
    shape = Shape(response_id="chatcmpl-1", model="m", created=5, logprobs=1, n=2)
    body = json.loads(sse_event(chat_response(shape, out))[6:])
    assert body["id"] == "chatcmpl-1" and body["object"] == "chat.completion"
    assert (body["created"], body["model"]) == (5, "m")
    assert [c["index"] for c in body["choices"]] == [0, 1]
    first = body["choices"][0]
    assert first["message"] == {"role": "assistant", "content": "a", "refusal": None}
    assert first["finish_reason"] == "stop"
    assert first["logprobs"]["content"][0] == {
        "token": "a",
        "logprob": -0.5,
        "bytes": [97],
        "top_logprobs": [{"token": "a", "logprob": -0.5, "bytes": [97]}],
    }
    assert body["choices"][1]["logprobs"] is None or body["choices"][1]["logprobs"] == {
        "content": []
    }
    assert body["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_completion_response_choice_indices_span_prompts() -> None:
    outs = [
        output(CompletionOutput(0, "x", [1]), CompletionOutput(1, "y", [1]), prompt=[1]),
        output(
            CompletionOutput(0, "z", [1, 2], finish_reason="length"),
            CompletionOutput(1, "w", [1]),
            prompt=[1, 2],
        ),
    ]
    shape = Shape(response_id="cmpl-1", model="m", created=1, n=2)
    body = json.loads(sse_event(completion_response(shape, outs, echo_texts=["P0", "P1"]))[6:])
    assert body["object"] == "text_completion"
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "P0x"),
        (1, "P0y"),
        (2, "P1z"),
        (3, "P1w"),
    ]
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 5


def test_chat_stream_lifecycle_with_usage() -> None:
    stream = ChatStream(
        Shape(response_id="chatcmpl-s", model="m", created=1, n=2, include_usage=True)
    )
    events = [*stream.begin()]
    events += stream.feed(0, output(CompletionOutput(0, "He", [1]), CompletionOutput(1, "", [])))
    events += stream.feed(0, output(CompletionOutput(0, "llo", [2, 3], finish_reason="stop")))
    events += stream.feed(0, output(CompletionOutput(1, "", [4], finish_reason="length")))
    events += stream.end()
    bodies = [json.loads(sse_event(e)[6:]) for e in events]
    assert all(b["id"] == "chatcmpl-s" and b["object"] == "chat.completion.chunk" for b in bodies)
    assert [b["choices"][0]["delta"] for b in bodies[:2]] == [
        {"role": "assistant", "content": ""}
    ] * 2
    assert [b["choices"][0]["index"] for b in bodies[:2]] == [0, 1]
    assert bodies[2]["choices"][0]["delta"] == {"content": "He"}
    assert bodies[3]["choices"][0] == {
        "index": 0,
        "delta": {"content": "llo"},
        "logprobs": None,
        "finish_reason": "stop",
        "stop_reason": None,
    }
    assert (
        bodies[4]["choices"][0]["delta"] == {}
        and bodies[4]["choices"][0]["finish_reason"] == "length"
    )
    assert all(b["usage"] is None for b in bodies[:-1])
    assert bodies[-1]["choices"] == []
    assert bodies[-1]["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_chat_stream_without_usage_has_no_usage_key() -> None:
    stream = ChatStream(Shape(response_id="c", model="m", created=1))
    [chunk] = stream.begin()
    assert "usage" not in json.loads(sse_event(chunk)[6:])
    assert stream.end() == []


def test_completion_stream_echo_and_logprob_offsets() -> None:
    stream = CompletionStream(
        Shape(response_id="cmpl-s", model="m", created=1, logprobs=1),
        echo_texts=["Hi"],
        first_tokens=["H"],
    )
    first = stream.feed(
        0,
        output(
            CompletionOutput(0, "ab", [1, 2], logprobs=[lp("a", -1.0, ("b", -0.1)), lp("b", -2.0)]),
            prompt_logprobs=[None, lp("i", -3.0)],
        ),
    )
    second = stream.feed(
        0, output(CompletionOutput(0, "c", [3], logprobs=[lp("c", -0.5)], finish_reason="stop"))
    )
    a = json.loads(sse_event(first[0])[6:])["choices"][0]
    b = json.loads(sse_event(second[0])[6:])["choices"][0]
    assert a["text"] == "Hiab"
    # The first prompt token has no context: listed, with null logprobs, as OpenAI does.
    assert a["logprobs"]["tokens"] == ["H", "i", "a", "b"]
    assert a["logprobs"]["token_logprobs"] == [None, -3.0, -1.0, -2.0]
    assert a["logprobs"]["top_logprobs"][0] is None
    assert a["logprobs"]["top_logprobs"][2] == {"b": -0.1, "a": -1.0}
    assert a["logprobs"]["text_offset"] == [0, 1, 2, 3]  # "i" ends the echoed "Hi"
    assert b["logprobs"]["text_offset"] == [4]  # after "Hiab"
    assert b["finish_reason"] == "stop"


def test_sse_framing_and_errors() -> None:
    assert SSE_DONE == b"data: [DONE]\n\n"
    stream = ChatStream(Shape(response_id="x", model="m", created=0))
    assert stream.done == SSE_DONE
    [error] = stream.fail(ProtocolError(500, "boom", code="engine_dead"))
    event = sse_event(error)
    assert event.startswith(b"data: {") and event.endswith(b"}\n\n")
    assert json.loads(event[6:]) == {
        "error": {"message": "boom", "type": "server_error", "param": None, "code": "engine_dead"}
    }


def test_impossible_logprobs_are_finite_and_partial_bytes_decode() -> None:
    out = output(
        CompletionOutput(0, "x", [1], logprobs=[lp("x", float("-inf"))], finish_reason="stop")
    )
    body = chat_response(Shape(response_id="c", model="m", created=1, logprobs=0), out)
    assert body.choices[0].logprobs.content[0].logprob == -9999.0  # type: ignore[union-attr]
    assert token_bytes("bytes:\\xe2\\x80") == [0xE2, 0x80]
    assert token_bytes("é") == [0xC3, 0xA9]


def test_merge_final_keeps_the_last_output_of_each_choice() -> None:
    merged = merge_final(
        [
            output(CompletionOutput(1, "b", [2], finish_reason="stop")),
            output(CompletionOutput(0, "a", [1], finish_reason="stop"), finished=True),
        ]
    )
    assert [o.text for o in merged.outputs] == ["a", "b"]
    with pytest.raises(ValueError):
        merge_final([])


# -- vLLM's extensions ------------------------------------------------------------------------


def test_generation_config_defaults_fill_only_unset_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "do_sample": False, "max_length": 9}
    defaults = SamplingDefaults.from_generation_config(config)
    assert defaults.overrides() == {"temperature": 0.6, "top_p": 0.9, "top_k": 20}
    params = plan_chat(chat(), LIMITS, defaults).params
    assert (params.temperature, params.top_p, params.top_k, params.min_p) == (0.6, 0.9, 20, 0.0)
    params = plan_completion(completion(temperature=0, top_k=-1), LIMITS, defaults).params
    assert (params.temperature, params.top_p, params.top_k) == (0, 0.9, -1)
    odd = SamplingDefaults.from_generation_config({"top_p": 0, "temperature": "hot", "min_p": 0.1})
    assert odd.overrides() == {"min_p": 0.1}
    assert "ignoring top_p" in caplog.text and "ignoring temperature" in caplog.text
    assert SamplingDefaults.from_generation_config({}).overrides() == {}


def test_truncation_keeps_the_last_tokens_unless_told_right() -> None:
    assert Truncation(2).apply([1, 2, 3], 10, 4) == [2, 3]
    assert Truncation(2, "right").apply([1, 2, 3], 10, 4) == [1, 2]
    assert Truncation(-1).apply(list(range(20)), 10, 4) == list(range(14, 20))
    assert Truncation(5).apply([1, 2], 10, 4) == [1, 2]
    error = error_of(Truncation(7).apply, [1], 10, 4)
    assert error.param == "truncate_prompt_tokens" and "10 - 4 = 6" in error.message
    assert error_of(plan_chat, chat(truncate_prompt_tokens=0), LIMITS).param == (
        "truncate_prompt_tokens"
    )


def test_vllm_sampling_fields_reach_the_params() -> None:
    plan = plan_chat(
        chat(bad_words=["x"], allowed_token_ids=[3, 4], prompt_logprobs=2, echo=True), LIMITS
    )
    p = plan.params
    assert (p.bad_words, p.allowed_token_ids, p.prompt_logprobs) == (["x"], [3, 4], 2)
    assert plan.echo_text is None  # the last message is the user's
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "A: "}]
    assert plan_chat(chat(messages=messages, echo=True), LIMITS).echo_text == "A: "
    # Echoed completions score the prompt with as many alternatives as either field asks.
    plan = plan_completion(completion(echo=True, logprobs=1, prompt_logprobs=3), LIMITS)
    assert (plan.params.prompt_logprobs, plan.prompt_logprobs) == (3, 3)
    assert error_of(plan_chat, chat(allowed_token_ids=[]), LIMITS).param == "allowed_token_ids"
    assert error_of(plan_chat, chat(bad_words=["x"] * 129), LIMITS).param == "bad_words"


def test_prompt_logprobs_shape_and_stop_reason_and_token_ids() -> None:
    position = PositionLogprobs(Logprob(7, -2.0, 3, "a"), [Logprob(8, -0.5, 1, "b")])
    out = output(
        CompletionOutput(0, "x", [9], finish_reason="stop", stop_reason="\n"),
        prompt=[6, 7],
        prompt_logprobs=[None, position],
    )
    shape = Shape(response_id="c", model="m", created=1, prompt_logprobs=1, return_token_ids=True)
    body = json.loads(sse_event(completion_response(shape, [out]))[6:])
    [choice] = body["choices"]
    assert choice["stop_reason"] == "\n"
    assert (choice["prompt_token_ids"], choice["token_ids"]) == ([6, 7], [9])
    assert choice["prompt_logprobs"] == [
        None,
        {
            "7": {"logprob": -2.0, "rank": 3, "decoded_token": "a"},
            "8": {"logprob": -0.5, "rank": 1, "decoded_token": "b"},
        },
    ]
    body = json.loads(sse_event(chat_response(shape, out))[6:])
    assert body["prompt_token_ids"] == [6, 7] and body["choices"][0]["token_ids"] == [9]
    assert body["prompt_logprobs"][1]["8"]["rank"] == 1
