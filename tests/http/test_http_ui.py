"""The chat page's routes over a fake engine: served from the package, self-contained, public
even when the API is not, and gone with --no-ui. (Its behaviour in a browser is
test_http_ui_browser.py.)"""

from __future__ import annotations

import re

import httpx
import pytest
from http_fake_engine import FakeEngine

from trio_llm.http import ServerConfig, build_app
from trio_llm.http.serve_flags import parse_serve_args

ASSETS = {
    "/": "text/html",
    "/ui/chat.js": "text/javascript",
    "/ui/markdown.js": "text/javascript",
    "/ui/chat.css": "text/css",
}


async def test_page_and_assets_are_served_and_self_contained(serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(FakeEngine(), config=ServerConfig()))
    async with httpx.AsyncClient(base_url=url) as client:
        for path, content_type in ASSETS.items():
            response = await client.get(path)
            assert response.status_code == 200, path
            assert response.headers["content-type"].startswith(content_type)
            assert "script-src 'self'" in response.headers["content-security-policy"]
            assert response.headers["x-content-type-options"] == "nosniff"
            # No CDN: nothing the page loads comes from another origin.
            assert not re.search(r"""(src|href|from)\s*=?\s*["'](https?:)?//""", response.text)
        page = (await client.get("/")).text
    assert set(re.findall(r"""(?:src|href)="(ui/[^"]+)""", page)) == {"ui/chat.js", "ui/chat.css"}


@pytest.mark.parametrize("path", ["/ui/nope.js", "/ui/..%2Fapp.py", "/ui/", "/index.html"])
async def test_only_the_page_files_are_served(serve_app, path: str) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(FakeEngine(), config=ServerConfig()))
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get(path)).status_code == 404


async def test_the_page_is_public_when_the_api_needs_a_key(serve_app) -> None:  # type: ignore[no-untyped-def]
    config = ServerConfig(api_key="sekrit", protect_all_routes=True)
    url = await serve_app(build_app(FakeEngine(), config=config))
    async with httpx.AsyncClient(base_url=url) as client:
        for path in ASSETS:
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/health")).status_code == 401


async def test_no_ui(serve_app) -> None:  # type: ignore[no-untyped-def]
    url = await serve_app(build_app(FakeEngine(), config=ServerConfig(ui=False)))
    async with httpx.AsyncClient(base_url=url) as client:
        for path in ASSETS:
            response = await client.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["message"] == f"Not found: GET {path}"
        assert (await client.get("/v1/models")).status_code == 200


def test_no_ui_flag_and_environment() -> None:
    assert parse_serve_args([], {}).ui
    assert not parse_serve_args(["--no-ui"], {}).ui
    assert not parse_serve_args([], {"TRIO_LLM_NO_UI": "1"}).ui
    assert parse_serve_args([], {"TRIO_LLM_NO_UI": "false"}).ui
