"""What a router in front of the server, and the server's own routing, rely on (over fake
engines): per-model admission, `X-Request-Id` echoed and used as the id, vLLM's render routes,
and `cache_salt` validated."""

from __future__ import annotations

from functools import partial

import httpx
import trio
from http_fake_engine import FakeEngine

from trio_llm.config import EngineArgs
from trio_llm.http import ServerConfig, build_app

CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


async def test_one_models_overload_does_not_refuse_another_models_requests(serve_app) -> None:  # type: ignore[no-untyped-def]
    busy, other = FakeEngine(name="a", hold_after_first=True), FakeEngine(name="b")
    config = ServerConfig(engine=EngineArgs(max_num_seqs=1), max_queued_requests=0)
    url = await serve_app(build_app(busy, other, config=config))
    async with httpx.AsyncClient(base_url=url) as c, trio.open_nursery() as nursery:
        nursery.start_soon(partial(c.post, "/v1/chat/completions", json=CHAT))
        with trio.fail_after(5):
            await busy.wait_for(lambda: len(busy.running) == 1)
        refused = await c.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "server_overloaded"
        served = await c.post("/v1/chat/completions", json={**CHAT, "model": "b"})
        assert served.status_code == 200
        nursery.cancel_scope.cancel()


async def test_x_request_id_is_echoed_and_names_the_response(serve_app) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine(name="a")
    url = await serve_app(build_app(engine))
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "router-42"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "router-42"
        assert r.json()["id"] == "chatcmpl-router-42"
        # Used twice at once, it still names both responses (the engine ids stay unique).
        both = [
            c.post("/v1/completions", json={"model": "a", "prompt": "x", "max_tokens": 2},
                   headers={"X-Request-Id": "same"})
            for _ in range(2)
        ]  # fmt: skip
        for response in [await b for b in both]:
            assert response.status_code == 200 and response.json()["id"] == "cmpl-same"
        # An id that is not one (too long, odd characters) is echoed but not used.
        odd = "a b" * 50
        r = await c.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": odd})
        assert r.headers["x-request-id"] == odd and "a b" not in r.json()["id"]
        errors = await c.post("/v1/chat/completions", json={}, headers={"X-Request-Id": "e1"})
        assert errors.status_code == 400 and errors.headers["x-request-id"] == "e1"
    assert {p for p in engine.prompts if "same" in p} and len(engine.prompts) == 4


async def test_the_render_routes_give_the_token_ids_without_generating(serve_app) -> None:  # type: ignore[no-untyped-def]
    engine = FakeEngine(name="a")
    url = await serve_app(build_app(engine))
    async with httpx.AsyncClient(base_url=url) as c:
        chat = await c.post("/v1/chat/completions/render", json={**CHAT, "cache_salt": "t1"})
        assert chat.status_code == 200
        body = chat.json()
        expected = await engine.apply_chat_template(CHAT["messages"])
        assert body["token_ids"] == expected and body["model"] == "a"
        assert body["cache_salt"] == "t1" and body["sampling_params"]["max_tokens"] == 3
        completions = await c.post(
            "/v1/completions/render", json={"model": "a", "prompt": [[1, 2], [3]], "max_tokens": 1}
        )
        assert [p["token_ids"] for p in completions.json()] == [[1, 2], [3]]
        responses = await c.post(
            "/v1/responses/render", json={"model": "a", "input": "hi", "max_output_tokens": 3}
        )
        assert responses.status_code == 200 and responses.json()["token_ids"]
        bad = await c.post("/v1/chat/completions/render", json={**CHAT, "model": "nope"})
        assert bad.status_code == 404
    assert not engine.prompts  # nothing was generated


async def test_an_empty_cache_salt_is_refused_naming_it(serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(FakeEngine(name="a")))
    async with httpx.AsyncClient(base_url=url) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "cache_salt": ""})
        assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt"
        ok = await c.post("/v1/chat/completions", json={**CHAT, "cache_salt": "tenant"})
        assert ok.status_code == 200


async def test_get_load_reports_each_engine_as_sglang_style_routers_read_it(serve_app) -> None:  # type: ignore[no-untyped-def]
    busy = FakeEngine(name="a", hold_after_first=True)
    url = await serve_app(build_app(busy, FakeEngine(name="b")))
    async with httpx.AsyncClient(base_url=url) as c, trio.open_nursery() as nursery:
        nursery.start_soon(partial(c.post, "/v1/chat/completions", json=CHAT))
        with trio.fail_after(5):
            await busy.wait_for(lambda: len(busy.running) == 1)
        loads = (await c.get("/get_load")).json()
        assert [(entry["dp_rank"], entry["num_reqs"]) for entry in loads] == [(0, 1), (0, 0)]
        assert all(entry["num_waiting_reqs"] == 0 for entry in loads)
        nursery.cancel_scope.cancel()
