"""The app over a fake engine, on real loopback sockets: routing, errors, auth, SSE framing,
overload, HTTP/2 (TLS+ALPN and h2c), and disconnects aborting generation."""

from __future__ import annotations

import json
import random
import ssl
from functools import partial

import httpx
import pytest
import trio
import trustme
from http_fake_engine import FakeEngine

from http_clients import (
    H2Client,
    HangUp,
    http1_request,
    http2_requests,
    random_hang_up,
    sse_payloads,
)
from trio_llm.config import EngineArgs
from trio_llm.http import ServerConfig, app_state, build_app

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
async def url(engine: FakeEngine, serve_app) -> str:  # type: ignore[no-untyped-def]
    return await serve_app(build_app(engine, config=ServerConfig(api_key="sekrit")))


@pytest.fixture
async def client(url: str):  # type: ignore[no-untyped-def]
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer sekrit"}) as c:
        yield c


# -- plain routes and errors ------------------------------------------------------------------


async def test_open_routes(client: httpx.AsyncClient, url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as anonymous:
        assert (await anonymous.get("/health")).json()["status"] == "ok"
        assert "version" in (await anonymous.get("/version")).json()
        doc = (await anonymous.get("/openapi.json")).json()
        assert "/v1/chat/completions" in doc["paths"]
        assert "ChatCompletionRequest" in doc["components"]["schemas"]
        metrics = (await anonymous.get("/metrics")).text
    assert "trio_llm_num_requests_running 0.0" in metrics
    assert "trio_llm_kv_cache_free_blocks 10.0" in metrics


async def test_models(client: httpx.AsyncClient) -> None:
    body = (await client.get("/v1/models")).json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert (card["id"], card["object"], card["max_model_len"]) == ("fake-model", "model", 128)
    assert (await client.get("/v1/models/fake-model")).json()["id"] == "fake-model"
    missing = await client.get("/v1/models/gpt-4")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path", ["/v1/models", "/tokenize", "/v1/nope"])
@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Basic sekrit", "Bearer sekritX"])
async def test_key_required_on_v1_and_tokenizer_routes(
    url: str, path: str, auth: str | None
) -> None:
    headers = {"Authorization": auth} if auth else {}
    async with httpx.AsyncClient(base_url=url, headers=headers) as c:
        response = (
            await c.post(path, json={"prompt": "x"}) if path == "/tokenize" else await c.get(path)
        )
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "invalid_api_key"


async def test_protect_all_routes_locks_health_and_metrics(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(
        build_app(engine, config=ServerConfig(api_key="k", protect_all_routes=True))
    )
    async with httpx.AsyncClient(base_url=url) as c:
        assert (await c.get("/health")).status_code == 401
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/health", headers={"Authorization": "Bearer k"})).status_code == 200


async def test_http_errors_are_openai_json(client: httpx.AsyncClient, url: str) -> None:
    not_found = await client.get("/nope")
    assert not_found.status_code == 404
    assert set(not_found.json()["error"]) == {"message", "type", "param", "code"}

    wrong_method = await client.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert "POST" in wrong_method.headers["allow"]
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"

    not_json = await client.post(
        "/v1/chat/completions", content=b"hi", headers={"Content-Type": "text/plain"}
    )
    assert not_json.status_code == 415

    bad_json = await client.post(
        "/v1/chat/completions", content=b"{", headers={"Content-Type": "application/json"}
    )
    assert bad_json.status_code == 400
    assert "Invalid JSON" in bad_json.json()["error"]["message"]

    bad_param = await client.post("/v1/chat/completions", json={**CHAT, "temperature": "hot"})
    assert (bad_param.status_code, bad_param.json()["error"]["param"]) == (400, "temperature")

    unknown_model = await client.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4"})
    assert unknown_model.status_code == 404

    too_long = await client.post("/v1/completions", json={"prompt": "x" * 200})
    error = too_long.json()["error"]
    assert (too_long.status_code, error["param"], error["code"]) == (
        400,
        "prompt",
        "context_length_exceeded",
    )
    assert "128" in error["message"] and "200" in error["message"]

    too_many = await client.post("/v1/completions", json={"prompt": "x" * 100, "max_tokens": 50})
    assert too_many.json()["error"]["param"] == "max_tokens"

    bad_token = await client.post("/v1/completions", json={"prompt": [1, 999]})
    assert bad_token.json()["error"]["param"] == "prompt"

    reserved = await client.post(
        "/v1/chat/completions", json={**CHAT, "chat_template_kwargs": {"tokenize": True}}
    )
    assert reserved.json()["error"]["param"] == "chat_template_kwargs"


@pytest.mark.parametrize(
    ("route", "body", "param"),
    [
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x" * 200}]},
            "messages",
        ),
        ("/v1/chat/completions", {**CHAT, "max_tokens": 120}, "max_tokens"),
        ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 120}, "max_completion_tokens"),
        ("/v1/completions", {"prompt": ["hi", "x" * 200]}, "prompt[1]"),
        ("/v1/completions", {"prompt": [[104, 105], [104] * 130]}, "prompt[1]"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 127}, "max_tokens"),
    ],
)
async def test_context_errors_name_the_field_to_fix(
    engine: FakeEngine, client: httpx.AsyncClient, route: str, body: dict, param: str
) -> None:
    response = await client.post(route, json=body)
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["code"]) == (
        400,
        param,
        "context_length_exceeded",
    )
    assert "maximum context length is 128" in error["message"]
    assert engine.prompts == {}  # refused before anything reached the engine


async def test_body_over_the_limit_is_413(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(engine, config=ServerConfig(max_body_size=1000)))
    async with httpx.AsyncClient(base_url=url) as c:
        response = await c.post("/v1/completions", json={"prompt": "x" * 2000})
    assert response.status_code == 413
    assert "1000 bytes" in response.json()["error"]["message"]


async def test_tokenize_and_detokenize(client: httpx.AsyncClient) -> None:
    body = (await client.post("/tokenize", json={"prompt": "hi", "return_token_strs": True})).json()
    assert body == {
        "count": 2,
        "max_model_len": 128,
        "tokens": [104, 105],
        "token_strs": ["h", "i"],
    }
    chat = (await client.post("/tokenize", json={"messages": CHAT["messages"]})).json()
    assert chat["count"] == len("<user>hi<assistant>")
    assert (await client.post("/detokenize", json={"tokens": [104, 105]})).json() == {
        "prompt": "hi"
    }
    assert (await client.post("/detokenize", json={"tokens": [1000]})).json()["error"][
        "param"
    ] == "tokens"
    assert (await client.post("/tokenize", json={})).status_code == 400


# -- generation -------------------------------------------------------------------------------


async def test_chat_non_streaming(client: httpx.AsyncClient) -> None:
    body = (await client.post("/v1/chat/completions", json={**CHAT, "n": 2})).json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert [c["message"]["content"] for c in body["choices"]] == ["abc", "bcd"]
    assert {c["finish_reason"] for c in body["choices"]} == {"length"}
    prompt = len("<user>hi<assistant>")
    assert body["usage"] == {
        "prompt_tokens": prompt,
        "completion_tokens": 6,
        "total_tokens": prompt + 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_chat_stream_framing(client: httpx.AsyncClient) -> None:
    request = {
        **CHAT,
        "stream": True,
        "stream_options": {"include_usage": True},
        "request_id": "abc",
    }
    response = await client.post("/v1/chat/completions", json=request)
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert {c["id"] for c in chunks} == {"chatcmpl-abc"}
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1]) == "abc"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def test_completions_over_several_prompts(client: httpx.AsyncClient) -> None:
    request = {"prompt": ["x", "yy"], "n": 2, "max_tokens": 2, "echo": True}
    body = (await client.post("/v1/completions", json=request)).json()
    assert [(c["index"], c["text"]) for c in body["choices"]] == [
        (0, "xab"),
        (1, "xbc"),
        (2, "yyab"),
        (3, "yybc"),
    ]
    assert body["usage"]["prompt_tokens"] == 3
    streamed = await client.post("/v1/completions", json={**request, "stream": True})
    texts: dict[int, str] = {}
    for payload in sse_payloads(streamed.text)[:-1]:
        for choice in json.loads(payload)["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {0: "xab", 1: "xbc", 2: "yyab", 3: "yybc"}


async def test_engine_death_mid_stream_is_an_error_event_then_done(
    engine: FakeEngine, client: httpx.AsyncClient
) -> None:
    engine.die_after_first = True
    payloads = sse_payloads(
        (await client.post("/v1/chat/completions", json={**CHAT, "stream": True})).text
    )
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert (error["type"], error["code"]) == ("server_error", "engine_dead")
    plain = await client.post("/v1/chat/completions", json=CHAT)
    assert plain.status_code == 500 and plain.json()["error"]["code"] == "engine_dead"


async def test_dead_engine_makes_health_503(engine: FakeEngine, client: httpx.AsyncClient) -> None:
    engine.is_alive = False
    assert (await client.get("/health")).status_code == 503
    refused = await client.post("/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503 and "retry-after" in refused.headers


async def test_overload_gets_503_with_retry_after(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    engine.hold_after_first = True
    config = ServerConfig(engine=EngineArgs(max_num_seqs=1), max_queued_requests=1)
    url = await serve_app(build_app(engine, config=config))
    async with httpx.AsyncClient(base_url=url) as c, trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(partial(c.post, "/v1/chat/completions", json=CHAT))
        with trio.fail_after(5):
            await engine.wait_for(lambda: len(engine.running) == 2)
        refused = await c.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_overloaded"
        nursery.cancel_scope.cancel()
    engine.hold_after_first = False
    async with httpx.AsyncClient(base_url=url) as c:
        with trio.fail_after(5):
            while (await c.post("/v1/chat/completions", json=CHAT)).status_code == 503:
                await engine.wait_for(lambda: not engine.running)  # the held ones are going away
    assert (
        "trio_llm_requests_rejected_total 1.0"
        in (await httpx.AsyncClient().get(url + "/metrics")).text
    )


async def test_cors_only_when_configured(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    plain = await serve_app(build_app(engine, config=ServerConfig()))
    open_ = await serve_app(
        build_app(engine, config=ServerConfig(allowed_origins=("https://a.example",)))
    )
    headers = {"Origin": "https://a.example"}
    async with httpx.AsyncClient() as c:
        assert (
            "access-control-allow-origin"
            not in (await c.get(plain + "/v1/models", headers=headers)).headers
        )
        allowed = await c.get(open_ + "/v1/models", headers=headers)
        assert allowed.headers["access-control-allow-origin"] == "https://a.example"
        preflight = await c.options(
            open_ + "/v1/chat/completions",
            headers={**headers, "Access-Control-Request-Method": "POST"},
        )
        assert preflight.headers["access-control-allow-origin"] == "https://a.example"


# -- timeouts, disconnects and HTTP/2 ---------------------------------------------------------


async def test_streams_outlive_quarts_response_timeout(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    engine.token_interval = 0.02
    app = build_app(engine, config=ServerConfig())
    app.config["RESPONSE_TIMEOUT"] = 0.05  # a tenth of the stream's length
    url = await serve_app(app)
    async with httpx.AsyncClient(base_url=url) as c:
        response = await c.post(
            "/v1/chat/completions", json={**CHAT, "max_tokens": 10, "stream": True}
        )
    payloads = sse_payloads(response.text)
    assert payloads[-1] == "[DONE]"
    assert (
        "".join(json.loads(p)["choices"][0]["delta"].get("content", "") for p in payloads[1:-1])
        == "abcdefghij"
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {**CHAT, "stream": True}),
        ("/v1/responses", {"input": "hi", "stream": True}),
        ("/v1/messages", {**CHAT, "stream": True}),
    ],
)
async def test_client_disconnect_aborts_streaming_over_http1(
    engine: FakeEngine, url: str, path: str, body: dict[str, object]
) -> None:
    engine.hold_after_first = True
    async with (
        httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer sekrit"}) as c,
        c.stream("POST", path, json=body) as response,
    ):
        async for _ in response.aiter_bytes():
            break
        with trio.fail_after(5):
            await engine.wait_for(lambda: len(engine.running) == 1)
    with trio.fail_after(1):
        await engine.wait_for(lambda: not engine.running)
    assert len(engine.aborted) == 1


async def test_router_abort_reaches_an_http_request(engine: FakeEngine, serve_app) -> None:  # type: ignore[no-untyped-def]
    """HTTP requests go through the router as the library's do: `Router.abort` of an engine
    request id ends that HTTP stream with finish_reason 'abort'."""
    app = build_app(engine)
    url = await serve_app(app)
    engine.hold_after_first = True
    async with (
        httpx.AsyncClient(base_url=url, timeout=30) as c,  # slow CI: not httpx's 5 s default
        c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as response,
    ):
        with trio.fail_after(30):
            await engine.wait_for(lambda: len(engine.running) == 1)
        [engine_id] = engine.running
        router = app_state(app).router
        assert router.holder(engine_id) is not None
        await router.abort(engine_id)
        events = sse_payloads((await response.aread()).decode())
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "abort"


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
async def test_client_disconnect_aborts_non_streaming(
    engine: FakeEngine, url: str, path: str
) -> None:
    engine.hold_after_first = True
    async with (
        httpx.AsyncClient(base_url=url, headers={"Authorization": "Bearer sekrit"}) as c,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(partial(c.post, path, json=CHAT))
        with trio.fail_after(5):
            await engine.wait_for(lambda: len(engine.running) == 1)
        nursery.cancel_scope.cancel()  # the client gives up: its connection closes
    with trio.fail_after(1):
        await engine.wait_for(lambda: not engine.running)
    assert len(engine.aborted) == 1


def _certs(tmp_path) -> tuple[str, str, ssl.SSLContext]:  # type: ignore[no-untyped-def]
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certfile, keyfile = str(tmp_path / "cert.pem"), str(tmp_path / "key.pem")
    cert.private_key_and_cert_chain_pem.write_to_path(certfile)
    cert.private_key_pem.write_to_path(keyfile)
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return certfile, keyfile, context


async def test_http2_over_tls_with_alpn(engine: FakeEngine, serve_app, tmp_path) -> None:  # type: ignore[no-untyped-def]
    certfile, keyfile, context = _certs(tmp_path)
    url = await serve_app(
        build_app(engine, config=ServerConfig()), certfile=certfile, keyfile=keyfile
    )
    assert url.startswith("https://")
    async with httpx.AsyncClient(base_url=url, http2=True, verify=context) as c:
        response = await c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        assert response.http_version == "HTTP/2"
        assert sse_payloads(response.text)[-1] == "[DONE]"
    async with httpx.AsyncClient(base_url=url, verify=context) as c:  # ALPN still offers 1.1
        assert (await c.get("/health")).http_version == "HTTP/1.1"


async def test_h2c_with_prior_knowledge(client: httpx.AsyncClient, url: str) -> None:
    async with httpx.AsyncClient(
        base_url=url, http1=False, http2=True, headers={"Authorization": "Bearer sekrit"}
    ) as c:
        response = await c.post("/v1/chat/completions", json=CHAT)
    assert response.http_version == "HTTP/2"
    assert response.json()["choices"][0]["message"]["content"] == "abc"


async def test_rst_stream_aborts_only_that_stream(engine: FakeEngine, url: str) -> None:
    engine.token_interval = 0.01
    host, port = url.removeprefix("http://").split(":")
    client = H2Client(await trio.open_tcp_stream(host, int(port)), f"{host}:{port}")
    await client.start()
    headers = {"authorization": "Bearer sekrit"}
    request = {**CHAT, "stream": True, "max_tokens": 30}
    first = await client.post("/v1/chat/completions", request, headers)
    second = await client.post("/v1/chat/completions", request, headers)
    with trio.fail_after(5):
        await client.receive_until(lambda: client.data[first] and client.data[second])
    await client.reset(first)
    with trio.fail_after(1):
        await engine.wait_for(lambda: len(engine.aborted) == 1)
    assert len(engine.running) == 1  # the other stream goes on
    with trio.fail_after(5):
        await client.receive_until(lambda: second in client.ended)
    assert sse_payloads(client.data[second].decode())[-1] == "[DONE]"
    assert first not in client.ended
    assert len(engine.finished) == 1
    await client.stream.aclose()


async def test_http2_connections_closed_mid_flight_abort_all_and_keep_serving(
    engine: FakeEngine, url: str
) -> None:
    """Clients that open several streams and close the connection at once, or after some data:
    every request is aborted and the server keeps serving. (Hypercorn alone lost the close on
    some streams, which then ran forever, and sometimes stopped the whole server; see
    trio_llm.http.hypercorn_fixes.) The moments are random, so many connections are tried."""
    engine.token_interval = 0.01  # 100 tokens outlast every hang-up delay
    host, port = url.removeprefix("http://").split(":")
    rng = random.Random(0)
    headers = {"Authorization": "Bearer sekrit"}
    for _ in range(12):
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                requests = []
                for _ in range(4):
                    hang_up = random_hang_up(rng)
                    stream = hang_up.mode in ("first_chunk", "mid_stream") or rng.random() < 0.5
                    body = {**CHAT, "max_tokens": 100, "stream": stream}
                    requests.append(("/v1/chat/completions", body, hang_up))
                nursery.start_soon(
                    partial(
                        http2_requests, (host, int(port)), requests, headers, close_connection=True
                    )
                )
    with trio.fail_after(5):
        await engine.wait_for(lambda: not engine.running)
    assert engine.aborted and not engine.finished
    async with httpx.AsyncClient(base_url=url, headers=headers) as c:
        assert (await c.post("/v1/chat/completions", json=CHAT)).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
async def test_connection_close_requests_get_their_connection_closed(
    url: str, stream: bool
) -> None:
    """HTTP/1.1 `Connection: close`: the server closes the connection after the response.
    (Hypercorn alone cancelled its own close half-way and left it open; see
    trio_llm.http.hypercorn_fixes.)"""
    host, port = url.removeprefix("http://").split(":")
    with trio.fail_after(5):
        received = await http1_request(
            (host, int(port)),
            "/v1/chat/completions",
            {**CHAT, "stream": stream},
            {"Authorization": "Bearer sekrit"},
            HangUp("complete"),  # reads until the server closes
        )
    assert received.startswith(b"HTTP/1.1 200")
