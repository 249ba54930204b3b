"""The chat page in a real headless browser (Debian's chromium, driven by Playwright) against the
real server on the tiny model: the API key asked for on 401, a streamed reply with its numbers,
Stop aborting the request in the engine, and Markdown rendered without letting model text in as
markup.

scripts/bootstrap.sh installs chromium with apt where it can (`./scripts/test.sh` does); where
it is missing these tests skip and say so. Playwright only drives it: `playwright install`
(which downloads a browser build of its own) is never needed.
"""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from http_server_process import ServerProcess, run_small_server

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (it is in the `test` extra)"
)
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if not Path(CHROMIUM).exists():
    pytest.skip(
        "Debian's chromium is not installed (scripts/bootstrap.sh installs it with apt-get as "
        "root; or `apt-get install chromium`)",
        allow_module_level=True,
    )

KEY = "page-key"
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_small_server(tiny_model_dir, "--served-model-name", "tiny", "--api-key", KEY) as s:
        yield s


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: sync_api.Browser) -> Iterator[sync_api.Page]:
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(20_000)
    yield page
    context.close()
    assert not errors, errors


def wait_until(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_chat_streams_a_reply_and_stop_aborts_it(
    server: ServerProcess, page: sync_api.Page
) -> None:
    expect = sync_api.expect
    response = page.goto(server.url + "/")
    assert response is not None and response.status == 200  # public, though the API needs a key

    # /v1/models answers 401, so the page asks for the key; with it, the picker fills.
    expect(page.locator("#auth")).to_be_visible()
    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    expect(page.locator("#model")).to_have_value("tiny")

    page.click("#settings-toggle")
    page.fill("#max-tokens", "8")
    page.fill("#extra", '{"ignore_eos": true}')
    page.fill("#prompt", "Say hello.")
    page.press("#prompt", "Enter")
    first = page.locator(".message.assistant").nth(0)
    stats = first.locator(".stats")
    expect(stats).to_contain_text("8 tokens")  # counted by the usage event
    assert re.search(
        r"TTFT \d+ ms · 8 tokens · [\d.]+ tok/s · cut at max tokens", stats.inner_text()
    )
    assert first.locator(".body").inner_text().strip()

    # A long reply: stop it while it streams, and the engine lets go of it.
    page.fill("#max-tokens", "1500")
    page.fill("#prompt", "Now tell me a very long story.")
    page.press("#prompt", "Enter")
    second = page.locator(".message.assistant").nth(1)
    expect(second.locator(".body")).not_to_have_text("")
    server.wait_running(1)
    page.click("#stop")
    expect(second.locator(".stats")).to_contain_text("stopped")
    wait_until(lambda: server.metrics()["trio_llm_num_requests_running"] == 0)
    assert server.wait_idle(5.0)["trio_llm_num_requests_running"] == 0
    expect(page.locator("#send")).to_be_visible()
    assert "≈" in second.locator(".stats").inner_text()  # no usage event: counted by events

    # The conversation is kept in the page: the third request carries both earlier turns.
    page.fill("#max-tokens", "4")
    page.fill("#prompt", "And a third question.")
    with page.expect_request("**/v1/chat/completions") as request:
        page.press("#prompt", "Enter")
    messages = request.value.post_data_json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant"] * 2 + ["user"]
    expect(page.locator(".message.assistant").nth(2).locator(".stats")).to_be_visible()


MARKDOWN = """# Title
Some **bold**, *italic*, `code <b>`, ~~gone~~ and a [link](https://example.com/a).
<img src=x onerror="window.pwned = 1"> <script>window.pwned = 2</script>
[bad](javascript:alert(1)) [worse](data:text/html,hi) https://example.org/x.

- one
  - nested
- two
1. first
2. second

> quoted

```python
print("<i>not html</i>")
```
```
unclosed fence, as while streaming"""


def test_markdown_renders_model_text_as_text(server: ServerProcess, page: sync_api.Page) -> None:
    page.goto(server.url + "/")
    html = page.evaluate(
        """async (text) => {
            const { renderMarkdown } = await import("./ui/markdown.js");
            const box = document.createElement("div");
            box.append(renderMarkdown(text));
            document.body.append(box);
            return box.innerHTML;
        }""",
        MARKDOWN,
    )
    assert page.evaluate("window.pwned") is None
    assert "<img" not in html and "<script" not in html and "<b>" not in html
    assert "&lt;img src=x onerror=" in html and "&lt;script&gt;" in html
    assert "<h1>Title</h1>" in html
    assert "<strong>bold</strong>" in html and "<em>italic</em>" in html
    assert "<code>code &lt;b&gt;</code>" in html and "<del>gone</del>" in html
    assert re.search(r'<a href="https://example.com/a"[^>]*>link</a>', html)
    assert re.search(r'<a href="https://example.org/x"[^>]*>https://example.org/x</a>\.', html)
    hrefs = page.evaluate("[...document.querySelectorAll('a')].map(a => a.href)")
    assert hrefs == ["https://example.com/a", "https://example.org/x"]
    assert "<ul><li>one<ul><li>nested</li></ul></li><li>two</li></ul>" in html
    assert "<ol><li>first</li><li>second</li></ol>" in html
    assert "<blockquote>quoted</blockquote>" in html
    assert '<pre><code class="language-python">print("&lt;i&gt;not html&lt;/i&gt;")' in html
    assert "<pre><code>unclosed fence, as while streaming</code></pre>" in html
