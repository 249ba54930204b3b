"""The real server (`python -m trio_llm serve`, a subprocess on loopback) with the real engine
on the tiny model, driven by the official OpenAI SDK (sync and async), raw httpx and raw h2."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import trio

from http_clients import H2Client, sse_payloads
from http_server_process import ServerProcess, run_server

KEY = "test-key"
PROMPT = [{"role": "user", "content": "Tell me a story about a cat."}]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_server(
        str(tiny_model_dir),
        "--served-model-name", "tiny",
        "--api-key", KEY,
        "--max-num-seqs", "8",
        "--kv-cache-memory", "32MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "5",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def greedy(sdk: openai.OpenAI, **extra: object) -> openai.types.chat.ChatCompletion:
    request: dict[str, object] = {"max_tokens": 12, "temperature": 0, **extra}
    return sdk.chat.completions.create(model="tiny", messages=PROMPT, **request)  # type: ignore[call-overload]


def test_chat_with_usage(sdk: openai.OpenAI) -> None:
    reply = greedy(sdk)
    assert reply.id.startswith("chatcmpl-") and reply.object == "chat.completion"
    assert reply.model == "tiny"
    [choice] = reply.choices
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = reply.usage
    assert usage is not None and usage.prompt_tokens > 5
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert reply.system_fingerprint and reply.system_fingerprint.startswith("fp_")
    again = greedy(sdk)  # the same prompt: its full blocks come from the prefix cache
    assert again.system_fingerprint == reply.system_fingerprint
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens >= 16


def test_max_tokens_gives_length(sdk: openai.OpenAI) -> None:
    reply = greedy(sdk, max_tokens=3, extra_body={"ignore_eos": True})
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None and reply.usage.completion_tokens == 3


def test_streaming_matches_non_streaming(sdk: openai.OpenAI) -> None:
    expected = greedy(sdk).choices[0].message.content
    stream = sdk.chat.completions.create(
        model="tiny",
        messages=PROMPT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert {c.id for c in chunks} == {chunks[0].id}


def test_n2_and_seed_reproducibility(sdk: openai.OpenAI) -> None:
    def sample(seed: int) -> list[str]:
        reply = sdk.chat.completions.create(
            model="tiny", messages=PROMPT, max_tokens=8, temperature=1.0, n=2, seed=seed
        )
        assert [c.index for c in reply.choices] == [0, 1]
        return [c.message.content or "" for c in reply.choices]

    first = sample(42)
    assert sample(42) == first
    assert first[0] != first[1]  # choices get seeds seed+0 and seed+1


def test_chat_logprobs(sdk: openai.OpenAI) -> None:
    reply = greedy(
        sdk, max_tokens=4, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True}
    )
    logprobs = reply.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 4
    for position in logprobs.content:
        assert position.logprob <= 0 and len(position.top_logprobs) == 2
        # greedy: the chosen token is the most likely one
        assert position.logprob == pytest.approx(position.top_logprobs[0].logprob, abs=1e-4)


def test_completion_stop_and_logprobs(sdk: openai.OpenAI) -> None:
    full = sdk.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    text = full.choices[0].text
    assert full.object == "text_completion" and full.id.startswith("cmpl-")
    stop = next(text[i : i + 2] for i in range(2, len(text) - 1) if text[i : i + 2].strip())
    cut = sdk.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=12, temperature=0, stop=[stop],
        logprobs=1, extra_body={"ignore_eos": True},
    )  # fmt: skip
    choice = cut.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == text[: text.index(stop)]
    assert choice.logprobs is not None and choice.logprobs.token_logprobs
    assert choice.model_extra["stop_reason"] == stop  # vLLM's: what ended it
    assert full.choices[0].model_extra["stop_reason"] is None


def _greedy_ids(sdk: openai.OpenAI, **extra: object) -> list[int]:
    reply = sdk.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True, **extra},
    )  # fmt: skip
    return reply.choices[0].model_extra["token_ids"]


def test_bad_words_and_allowed_token_ids(server: ServerProcess, sdk: openai.OpenAI) -> None:
    ids = _greedy_ids(sdk)
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=server.url, headers=headers) as c:

        def tokens(text: str) -> list[int]:
            body = {"prompt": text, "add_special_tokens": False}
            return c.post("/tokenize", json=body).json()["tokens"]

        def word_of(token: int) -> str | None:
            """A bad word that is `token` alone: bare, or after a space where the bare word is
            one token too (vLLM's rule for the spaced form)."""
            word = c.post("/detokenize", json={"tokens": [token]}).json()["prompt"].strip()
            if not word:
                return None
            bare, spaced = tokens(word), tokens(" " + word)
            if bare == [token] or (spaced == [token] and len(bare) == 1):
                return word
            return None

        banned, word = next((t, w) for t in ids if (w := word_of(t)) is not None)
    without = _greedy_ids(sdk, bad_words=[word])
    assert banned not in without and without != ids
    allowed = sorted(set(ids[:2]))
    assert set(_greedy_ids(sdk, allowed_token_ids=allowed)) <= set(allowed)
    assert _greedy_ids(sdk, allowed_token_ids=ids[:1]) == ids[:1] * 6


def test_prompt_logprobs_and_echoed_logprobs(sdk: openai.OpenAI) -> None:
    reply = sdk.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=2, temperature=0, echo=True,
        logprobs=1, extra_body={"prompt_logprobs": 2, "return_token_ids": True},
    )  # fmt: skip
    choice = reply.choices[0]
    prompt_ids = choice.model_extra["prompt_token_ids"]
    positions = choice.model_extra["prompt_logprobs"]
    assert reply.usage is not None and len(positions) == reply.usage.prompt_tokens
    assert positions[0] is None  # the first token has no context
    for token, position in zip(prompt_ids[1:], positions[1:], strict=True):
        assert str(token) in position and 2 <= len(position) <= 3
        assert {"logprob", "rank", "decoded_token"} == set(position[str(token)])
    # Echoed legacy logprobs list the first prompt token with a null logprob, as OpenAI does.
    logprobs = choice.logprobs
    assert logprobs is not None and logprobs.tokens and logprobs.token_logprobs
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None  # type: ignore[index]
    assert len(logprobs.tokens) == len(prompt_ids) + 2
    assert all(lp is not None for lp in logprobs.token_logprobs[1:])
    assert "".join(logprobs.tokens) == choice.text
    chat = greedy(sdk, max_tokens=2, extra_body={"prompt_logprobs": 0})
    assert chat.usage is not None
    assert len(chat.model_extra["prompt_logprobs"]) == chat.usage.prompt_tokens


def test_sdk_typed_errors(server: ServerProcess, sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        greedy(sdk, max_tokens=100_000)
    assert bad.value.body["param"] == "max_tokens"  # type: ignore[index]
    assert "context" in bad.value.message
    with pytest.raises(openai.BadRequestError):
        greedy(sdk, temperature=-1)
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(model="gpt-4", messages=PROMPT)
    with (
        openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.models.list()
    assert [m.id for m in sdk.models.list()] == ["tiny"]


async def test_async_sdk_stream_and_batch(server: ServerProcess) -> None:
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(
            model="tiny", messages=PROMPT, max_tokens=5, temperature=0, stream=True,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(pieces)
        batch = await sdk.completions.create(
            model="tiny", prompt=["Hello", "The sky is"], max_tokens=4, temperature=0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert [c.index for c in batch.choices] == [0, 1]
        assert batch.usage is not None and batch.usage.completion_tokens == 8


async def test_every_request_gets_the_same_tokens_alone_and_batched(server: ServerProcess) -> None:
    """16 greedy, 16 seeded and 16 unseeded sampled requests, 16 at a time (the server admits
    twice its 8 running sequences), then each alone: the same text. An unseeded request's seed
    is the one the server drew and sent back in x-trio-llm-seed (none for greedy or seeded
    ones); replayed with it, it repeats.
    The server's float32 engine keeps batch invariance (auto is on there on every CPU class:
    tests/engine/test_batch_invariance.py)."""
    kinds = [{"temperature": 0}] * 16
    kinds += [{"temperature": 1.0, "seed": 100 + i} for i in range(16)]
    kinds += [{"temperature": 1.0}] * 16

    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0) as sdk:

        async def ask(
            i: int, extra: dict[str, object], out: dict[int, tuple[str, str | None]]
        ) -> None:
            raw = await sdk.chat.completions.with_raw_response.create(
                model="tiny", messages=PROMPT, max_tokens=8, extra_body={"ignore_eos": True},
                **extra,  # type: ignore[arg-type]
            )  # fmt: skip
            out[i] = (
                raw.parse().choices[0].message.content or "",
                raw.headers.get("x-trio-llm-seed"),
            )

        together: dict[int, tuple[str, str | None]] = {}
        admitted = trio.CapacityLimiter(16)

        async def ask_admitted(i: int, extra: dict[str, object]) -> None:
            async with admitted:
                await ask(i, extra, together)

        async with trio.open_nursery() as nursery:
            for i, extra in enumerate(kinds):
                nursery.start_soon(ask_admitted, i, extra)
        drawn = [together[i][1] for i in range(48)]
        assert drawn[:32] == [None] * 32 and all(d is not None for d in drawn[32:])
        assert len({together[i][0] for i in range(32, 48)}) > 1  # they did sample
        for i, extra in enumerate(kinds):
            replay = {**extra, "seed": int(drawn[i])} if drawn[i] is not None else extra
            alone: dict[int, tuple[str, str | None]] = {}
            await ask(i, replay, alone)
            assert alone[i][0] == together[i][0], (i, extra)


async def test_raw_sse_and_h2c(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    request = {"model": "tiny", "messages": PROMPT, "max_tokens": 4, "stream": True}
    async with httpx.AsyncClient(
        base_url=server.url, headers=headers, http1=False, http2=True
    ) as c:
        response = await c.post("/v1/chat/completions", json=request)
    assert response.http_version == "HTTP/2"
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    assert json.loads(payloads[0])["choices"][0]["delta"]["role"] == "assistant"


# -- disconnects abort generation in the engine -----------------------------------------------

LONG = {
    "model": "tiny",
    "messages": PROMPT,
    "max_tokens": 1000,
    "ignore_eos": True,
}


def test_disconnect_aborts_streaming_http1(server: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    with (
        httpx.Client(base_url=server.url, headers=headers) as c,
        c.stream("POST", "/v1/chat/completions", json={**LONG, "stream": True}) as response,
    ):
        events = (line for line in response.iter_lines() if line.startswith("data:"))
        for _ in range(3):  # the role chunk, then tokens: the engine runs it
            next(events)
        server.wait_running(1)
    m = server.wait_idle(1.0)
    assert m["trio_llm_num_requests_running"] == 0
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]


async def test_disconnect_aborts_non_streaming(server: ServerProcess) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    body = json.dumps(LONG).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    stream = await trio.open_tcp_stream(host, int(port))
    await stream.send_all(head.encode() + body)
    await trio.to_thread.run_sync(server.wait_running, 1)
    await stream.aclose()  # hang up while the complete response is still being generated
    m = await trio.to_thread.run_sync(server.wait_idle, 1.0)
    assert m["trio_llm_num_requests_running"] == 0
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]


async def test_rst_stream_aborts_one_stream_of_many(server: ServerProcess) -> None:
    host, port = server.url.removeprefix("http://").split(":")
    client = H2Client(await trio.open_tcp_stream(host, int(port)), f"{host}:{port}")
    await client.start()
    headers = {"authorization": f"Bearer {KEY}"}
    doomed = await client.post("/v1/chat/completions", {**LONG, "stream": True}, headers)
    survivor = await client.post(
        "/v1/chat/completions", {**LONG, "stream": True, "max_tokens": 40}, headers
    )
    with trio.fail_after(30):
        await client.receive_until(lambda: client.data[doomed].count(b"data:") > 2)
    await client.reset(doomed)
    with trio.fail_after(30):
        await client.receive_until(lambda: survivor in client.ended)
    assert sse_payloads(client.data[survivor].decode())[-1] == "[DONE]"
    assert doomed not in client.ended
    m = await trio.to_thread.run_sync(server.wait_idle, 1.0)
    assert m["trio_llm_num_requests_running"] == 0
    assert m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]
    await client.stream.aclose()


def test_metrics_count_requests_and_tokens(server: ServerProcess) -> None:
    text = httpx.get(server.url + "/metrics").text
    assert (
        'trio_llm_http_requests_total{method="POST",route="/v1/chat/completions",status="200"}'
        in text
    )
    assert "trio_llm_time_to_first_token_seconds_count" in text
    m = server.metrics()
    assert m["trio_llm_generation_tokens_total"] > 0 and m["trio_llm_prompt_tokens_total"] > 0
    assert m["trio_llm_engine_alive"] == 1
    assert 'vllm:num_requests_running{model_name="tiny"}' in text
    assert 'vllm:generation_tokens_total{model_name="tiny"}' in text


async def test_engine_crash_fails_in_flight_requests_then_restarts(server: ServerProcess) -> None:
    engine_pid = await trio.to_thread.run_sync(server.engine_pid)
    results: dict[str, httpx.Response] = {}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=60) as c:

        async def post(name: str, body: dict) -> None:
            results[name] = await c.post("/v1/chat/completions", json=body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(post, "stream", {**LONG, "stream": True})
            nursery.start_soon(post, "plain", LONG)
            await trio.to_thread.run_sync(server.wait_running, 2)
            os.kill(engine_pid, signal.SIGKILL)
        plain = results["plain"]
        assert plain.status_code == 500 and plain.json()["error"]["code"] == "engine_dead"
        events = sse_payloads(results["stream"].text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "engine_dead"
        assert (await c.get("/health")).status_code == 503
        await trio.to_thread.run_sync(server.wait_healthy, 120)  # the supervisor restarted it
        again = await c.post("/v1/chat/completions", json={**LONG, "max_tokens": 3})
        assert again.status_code == 200 and again.json()["usage"]["completion_tokens"] == 3


def test_sigterm_lets_a_stream_finish_then_exits_0(server: ServerProcess) -> None:
    """Last in the module: it shuts the module's server down (run_server checks exit 0)."""
    request = {
        **LONG,
        "max_tokens": 30,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}) as c,
        c.stream("POST", "/v1/chat/completions", json=request) as response,
    ):
        lines = response.iter_lines()
        next(lines)
        server.process.terminate()  # SIGTERM mid-stream
        rest = [line for line in lines if line]
    assert rest[-1] == "data: [DONE]"
    # Nothing was cut: the stream ran to its length (a client that falls behind may get two
    # tokens in one chunk, so chunks are not counted).
    chunks = [json.loads(line.removeprefix("data: ")) for line in rest[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 30
    assert server.process.wait(30) == 0
