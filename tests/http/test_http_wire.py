"""Wire compatibility with clients written for vLLM and OpenAI, over a fake engine on loopback:
the official SDK (extra_body for vLLM's fields) and raw httpx. What needs the real engine
(bad words, allowed tokens, prompt logprobs, cached tokens) is in test_http_server.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from http_fake_engine import FakeEngine

from http_clients import sse_payloads
from trio_llm.http import ServerConfig, build_app

KEY = "sekrit"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine(generation_config={"temperature": 0.25, "top_k": 7, "do_sample": True})


@pytest.fixture
async def url(engine: FakeEngine, serve_app) -> str:  # type: ignore[no-untyped-def]
    return await serve_app(build_app(engine, config=ServerConfig(api_key=KEY)))


@pytest.fixture
async def sdk(url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


@pytest.fixture
async def client(url: str) -> AsyncIterator[httpx.AsyncClient]:
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as c:
        yield c


async def chat(sdk: openai.AsyncOpenAI, **extra: Any) -> Any:
    request: dict[str, Any] = {"model": "fake-model", "messages": HI, "max_tokens": 3, **extra}
    return await sdk.chat.completions.create(**request)


async def refusal(sdk: openai.AsyncOpenAI, **extra: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        await chat(sdk, **extra)
    return info.value.body  # type: ignore[return-value]


# -- silent drops: honoured or refused --------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"use_beam_search": True}, "use_beam_search"),
        ({"structural_tag": {"type": "structural_tag"}}, "structural_tag"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": {"name": "f"}}, "function_call"),
        ({"documents": [{"title": "t", "text": "x"}]}, "documents"),
        ({"chat_template": "{{ messages }}"}, "chat_template"),
        ({"logprob_token_ids": [1]}, "logprob_token_ids"),
        ({"messages": [{"role": "user", "content": [{"type": "video_url", "video_url": "x"}]}]},
         "messages[0].content[0]"),
    ],
)  # fmt: skip
async def test_fields_that_change_the_output_are_refused_by_name(
    sdk: openai.AsyncOpenAI, engine: FakeEngine, body: dict[str, Any], param: str
) -> None:
    error = await refusal(sdk, extra_body=body)
    assert error["param"] == param and error["code"] == "unsupported"
    assert error["message"].startswith(f"{param}: ") and "not supported" in error["message"]
    assert not engine.prompts  # nothing reached the engine


async def test_values_that_ask_for_nothing_and_unknown_fields_pass(
    sdk: openai.AsyncOpenAI,
) -> None:
    reply = await chat(
        sdk,
        extra_body={
            "use_beam_search": False,
            "tool_choice": "none",
            "tools": [],
            "response_format": {"type": "text"},
            "some_future_field": {"x": 1},
        },
    )
    assert reply.choices[0].message.content == "abc"


async def test_stream_options_need_stream(sdk: openai.AsyncOpenAI) -> None:
    error = await refusal(sdk, stream_options={"include_usage": True})
    assert error["param"] == "stream_options"
    error = await refusal(sdk, stream=True, extra_body={"prompt_logprobs": 1})
    assert error["param"] == "prompt_logprobs"


async def test_continuous_usage_stats_put_usage_on_every_chunk(client: httpx.AsyncClient) -> None:
    request = {
        "messages": HI,
        "max_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    for route, extra in (("/v1/chat/completions", {}), ("/v1/completions", {"prompt": "hi"})):
        response = await client.post(route, json={**request, **extra})
        chunks = [json.loads(p) for p in sse_payloads(response.text)[:-1]]
        assert all(c["usage"] is not None for c in chunks), route
        done = [c["usage"]["completion_tokens"] for c in chunks]
        assert done == sorted(done) and done[-1] == 3 and done[0] <= 1
        prompt = len("<user>hi<assistant>") if "chat" in route else len("hi")
        assert {c["usage"]["prompt_tokens"] for c in chunks} == {prompt}


async def test_return_token_ids(client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
    reply = await chat(sdk, extra_body={"return_token_ids": True})
    prompt = [ord(c) for c in "<user>hi<assistant>"]
    assert reply.model_extra["prompt_token_ids"] == prompt
    assert reply.choices[0].model_extra["token_ids"] == [ord(c) for c in "abc"]
    plain = await chat(sdk)
    assert "prompt_token_ids" not in plain.model_extra
    assert "token_ids" not in plain.choices[0].model_extra

    completion = await sdk.completions.create(
        model="fake-model", prompt="hi", max_tokens=2, extra_body={"return_token_ids": True}
    )
    choice = completion.choices[0].model_extra
    assert choice["prompt_token_ids"] == [ord("h"), ord("i")] and choice["token_ids"] == [97, 98]

    request = {"messages": HI, "max_tokens": 3, "stream": True, "return_token_ids": True}
    chunks = [
        json.loads(p)
        for p in sse_payloads((await client.post("/v1/chat/completions", json=request)).text)[:-1]
    ]
    assert chunks[0]["prompt_token_ids"] == prompt
    assert [t for c in chunks for t in c["choices"][0].get("token_ids", [])] == [97, 98, 99]
    request = {"prompt": "hi", "max_tokens": 2, "stream": True, "return_token_ids": True}
    chunks = [
        json.loads(p)
        for p in sse_payloads((await client.post("/v1/completions", json=request)).text)[:-1]
    ]
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [ord("h"), ord("i")]
    assert "prompt_token_ids" not in chunks[1]["choices"][0]


async def test_truncate_prompt_tokens_keeps_the_end_by_default(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    await sdk.completions.create(
        model="fake-model", prompt="abcdef", max_tokens=2, extra_body={"truncate_prompt_tokens": 2}
    )
    await sdk.completions.create(
        model="fake-model",
        prompt="abcdef",
        max_tokens=2,
        echo=True,
        extra_body={"truncate_prompt_tokens": 3, "truncation_side": "right"},
    )
    left, right = engine.prompts.values()
    assert left == [ord("e"), ord("f")] and right == [ord("a"), ord("b"), ord("c")]
    reply = await chat(sdk, extra_body={"truncate_prompt_tokens": -1})  # fits: unchanged
    assert reply.usage.prompt_tokens == len("<user>hi<assistant>")
    error = await refusal(sdk, extra_body={"truncate_prompt_tokens": 126})  # 128 - 3 leaves 125
    assert error["param"] == "truncate_prompt_tokens"


# -- fields clients read ----------------------------------------------------------------------


async def test_stop_reason_cached_tokens_and_a_stable_fingerprint(
    client: httpx.AsyncClient, sdk: openai.AsyncOpenAI
) -> None:
    first, second = await chat(sdk), await chat(sdk, max_tokens=1)
    assert first.system_fingerprint and first.system_fingerprint == second.system_fingerprint
    assert first.choices[0].model_extra == {"stop_reason": None}
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    completion = await sdk.completions.create(model="fake-model", prompt="x", max_tokens=1)
    assert completion.system_fingerprint == first.system_fingerprint
    assert completion.choices[0].model_extra["stop_reason"] is None
    assert completion.usage.prompt_tokens_details.cached_tokens == 0
    request = {"messages": HI, "max_tokens": 2, "stream": True}
    request["stream_options"] = {"include_usage": True}
    chunks = [
        json.loads(p)
        for p in sse_payloads((await client.post("/v1/chat/completions", json=request)).text)[:-1]
    ]
    assert {c["system_fingerprint"] for c in chunks} == {first.system_fingerprint}
    assert chunks[-1]["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


# -- messages and roles -----------------------------------------------------------------------


async def test_any_role_reaches_the_chat_template(
    sdk: openai.AsyncOpenAI, engine: FakeEngine
) -> None:
    messages = [
        {"role": "narrator", "content": "once"},
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
    ]
    await chat(sdk, messages=messages)
    [prompt] = engine.prompts.values()
    assert "".join(map(chr, prompt)) == "<narrator>once<user>go<assistant>"
    error = await refusal(sdk, messages=[{"role": "function", "content": "x", "name": "f"}])
    assert error["param"] == "messages[0]"


async def test_echo_with_continue_final_message_starts_with_the_final_message(
    sdk: openai.AsyncOpenAI, client: httpx.AsyncClient
) -> None:
    messages = [*HI, {"role": "assistant", "content": "Sure: "}]
    extra = {"echo": True, "continue_final_message": True, "add_generation_prompt": False}
    reply = await chat(sdk, messages=messages, n=2, extra_body=extra)
    assert [c.message.content for c in reply.choices] == ["Sure: abc", "Sure: bcd"]
    plain = await chat(sdk, messages=messages, extra_body={**extra, "echo": False})
    assert plain.choices[0].message.content == "abc"
    request = {"messages": messages, "max_tokens": 3, "stream": True, **extra}
    chunks = [
        json.loads(p)
        for p in sse_payloads((await client.post("/v1/chat/completions", json=request)).text)[:-1]
    ]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "Sure: abc"


# -- errors that name the field ---------------------------------------------------------------


async def test_validation_errors_name_the_field(sdk: openai.AsyncOpenAI) -> None:
    error = await refusal(sdk, logit_bias={"not_a_token_id": 1})
    assert error["param"] == "logit_bias"
    assert error["message"] == (
        'Invalid request: logit_bias: the key "not_a_token_id" is not a token id; keys must be '
        "token ids (Expected `int`, got `str`)"
    )
    error = await refusal(sdk, logit_bias={"5": 1, "-7": 1})
    assert error["param"] == "logit_bias" and '"-7" is not a token id' in error["message"]
    error = await refusal(sdk, logit_bias={"x": 1, "5": 1, "-7": 1})  # every bad key named
    assert error["param"] == "logit_bias" and 'the keys "x", "-7" are not' in error["message"]
    error = await refusal(sdk, logit_bias={"5": 1, "999999": 1, "888888": 1})
    assert error["param"] == "logit_bias" and "[888888, 999999]" in error["message"]
    error = await refusal(sdk, logit_bias={"5": "high"})
    assert error["param"] == "logit_bias" and 'the value for "5"' in error["message"]
    error = await refusal(sdk, extra_body={"top_k": "many"})
    assert error["param"] == "top_k" and error["message"].startswith("Invalid request: top_k: ")
    error = await refusal(sdk, messages=[{"role": "user", "content": 5}])
    assert error["param"] == "messages[0].content"
    assert error["message"].startswith("Invalid request: messages[0].content: ")


# -- deployment -------------------------------------------------------------------------------


async def test_ping_and_invocations(url: str, client: httpx.AsyncClient) -> None:
    async with httpx.AsyncClient(base_url=url) as anonymous:
        assert (await anonymous.get("/ping")).status_code == 200
        assert (await anonymous.post("/ping")).status_code == 200
        assert (await anonymous.post("/invocations", json={"prompt": "x"})).status_code == 401
    chat_reply = (await client.post("/invocations", json={"messages": HI, "max_tokens": 2})).json()
    assert chat_reply["object"] == "chat.completion"
    assert chat_reply["choices"][0]["message"]["content"] == "ab"
    text = (await client.post("/invocations", json={"prompt": "x", "max_tokens": 2})).json()
    assert text["object"] == "text_completion" and text["choices"][0]["text"] == "ab"
    streamed = await client.post("/invocations", json={"prompt": "x", "stream": True})
    assert sse_payloads(streamed.text)[-1] == "[DONE]"
    neither = await client.post("/invocations", json={"max_tokens": 2})
    assert neither.status_code == 400 and neither.json()["error"]["param"] == "messages"
    refused = await client.post("/invocations", json={"prompt": "x", "use_beam_search": True})
    assert refused.json()["error"]["param"] == "use_beam_search"


async def test_vllm_metric_names(client: httpx.AsyncClient, sdk: openai.AsyncOpenAI) -> None:
    await chat(sdk)
    text = (await client.get("/metrics")).text
    label = '{model_name="fake-model"}'
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert name + label in text, name
    assert 'vllm:request_success_total{finished_reason="length",model_name="fake-model"} 1.0' in (
        text
    )
    assert "vllm:generation_tokens_total" + label + " 3.0" in text
    assert "trio_llm_generation_tokens_total 3.0" in text  # the project's own, alongside
    # llm-d's endpoint picker reads the block size and count from vLLM's labels exactly
    assert 'vllm:cache_config_info{block_size="16",num_gpu_blocks="10"} 1.0' in text
    assert "vllm:lora_requests_info" not in text  # only with LoRA enabled


async def test_the_models_generation_config_sets_the_defaults(
    engine: FakeEngine, sdk: openai.AsyncOpenAI, serve_app
) -> None:  # type: ignore[no-untyped-def]
    await chat(sdk)
    await chat(sdk, temperature=0.9, extra_body={"top_k": 0})
    await sdk.completions.create(model="fake-model", prompt="x", max_tokens=1)
    model, given, completion = engine.params.values()
    assert (model.temperature, model.top_k, model.top_p) == (0.25, 7, 1.0)
    assert (given.temperature, given.top_k) == (0.9, 0)
    assert (completion.temperature, completion.top_k) == (0.25, 7)

    off = FakeEngine(generation_config=engine.generation_config)
    url = await serve_app(build_app(off, config=ServerConfig(generation_config="none")))
    async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as plain:
        await chat(plain)
    [params] = off.params.values()
    assert (params.temperature, params.top_k) == (1.0, 0)


async def test_several_models_each_get_their_own_defaults_metrics_and_invocations(
    engine: FakeEngine, serve_app
) -> None:  # type: ignore[no-untyped-def]
    """Behind one server: each model's sampling defaults are its own generation config, its
    vLLM-named figures carry its own `model_name`, and /invocations (an `input` body: embeddings)
    and /tokenize reach the model the body names."""
    other = FakeEngine(name="other-model", generation_config={"temperature": 0.75})
    embedder = FakeEngine(name="embedder", task="embed")
    url = await serve_app(build_app(engine, other, embedder, config=ServerConfig()))
    async with httpx.AsyncClient(base_url=url, timeout=30) as c:
        for model in ("fake-model", "other-model"):
            body = {"model": model, "messages": HI, "max_tokens": 3}
            assert (await c.post("/invocations", json=body)).json()["model"] == model
        await c.post(
            "/v1/completions", json={"model": "other-model", "prompt": "x", "max_tokens": 8}
        )
        embedded = (await c.post("/invocations", json={"model": "embedder", "input": "ab"})).json()
        assert embedded["object"] == "list" and embedded["model"] == "embedder"
        assert embedded["data"][0]["embedding"] == [97.0, 98.0, 0.0, 0.0]
        wrong = await c.post("/invocations", json={"model": "fake-model", "input": "ab"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model"
        tokens = await c.post("/tokenize", json={"model": "embedder", "prompt": "ab"})
        assert tokens.json()["tokens"] == [97, 98]
        text = (await c.get("/metrics")).text
    [mine] = engine.params.values()
    theirs = list(other.params.values())
    assert (mine.temperature, mine.top_k) == (0.25, 7)
    assert [(p.temperature, p.top_k) for p in theirs] == [(0.75, 0), (0.75, 0)]
    # 3 + 3 + 8 tokens in all; 3 for the first model, 11 for the second (its completion: 8).
    assert "trio_llm_generation_tokens_total 14.0" in text
    assert 'vllm:generation_tokens_total{model_name="fake-model"} 3.0' in text
    assert 'vllm:generation_tokens_total{model_name="other-model"} 11.0' in text
    assert 'vllm:prompt_tokens_total{model_name="embedder"} 2.0' in text
    assert 'vllm:generation_tokens_total{model_name="embedder"} 0.0' in text
    for model in ("fake-model", "other-model", "embedder"):
        assert f'vllm:num_requests_running{{model_name="{model}"}} 0.0' in text
    assert 'vllm:e2e_request_latency_seconds_count{model_name="other-model"} 2.0' in text
    assert "trio_llm_e2e_request_latency_seconds_count 3.0" in text


async def test_cors_preflight_from_openai_node(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(
        build_app(engine, config=ServerConfig(allowed_origins=("https://app.example",)))
    )
    asked = (
        "authorization,content-type,x-stainless-arch,x-stainless-lang,x-stainless-os,"
        "x-stainless-package-version,x-stainless-retry-count,x-stainless-runtime,"
        "x-stainless-runtime-version,x-stainless-timeout"
    )
    async with httpx.AsyncClient() as c:
        preflight = await c.options(
            url + "/v1/chat/completions",
            headers={
                "Origin": "https://app.example",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": asked,
            },
        )
    assert preflight.headers["access-control-allow-origin"] == "https://app.example"
    allowed = {
        h.strip().lower() for h in preflight.headers["access-control-allow-headers"].split(",")
    }
    assert set(asked.split(",")) <= allowed
