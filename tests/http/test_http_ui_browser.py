"""The chat page in a real headless browser (Debian's chromium, driven by Playwright) against the
real server on the tiny model: the API key asked for on 401, a streamed reply with its numbers,
Stop aborting the request in the engine, Markdown rendered without letting model text in as
markup, and pictures (picked, pasted, dropped) sent to a tiny vision model, refused for a
text-only one.

scripts/bootstrap.sh installs chromium with apt where it can (`./scripts/test.sh` does); where
it is missing these tests skip and say so. Playwright only drives it: `playwright install`
(which downloads a browser build of its own) is never needed.
"""

from __future__ import annotations

import base64
import io
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from http_server_process import ServerProcess, run_server, run_small_server
from trio_llm.model_files import ModelSource, load_tokenizer
from vision_models import build_tiny_llava, picture

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


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    picture(seed).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def vision_server(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource, tiny_model_dir: Path
) -> Iterator[ServerProcess]:
    """A tiny LLaVA and the tiny text model behind one server: the page must tell them apart."""
    llava = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(llava, load_tokenizer(tokenizer_source))
    with run_server(
        f"{llava}:name=llava",
        f"{tiny_model_dir}:name=tiny",
        "--max-num-seqs", "2",
        "--kv-cache-memory", "16MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "2",
    ) as s:  # fmt: skip
        yield s


# A file as a paste or a drop carries it (Playwright has no clipboard or drag of files itself).
CARRY = """([b64, kind]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const transfer = new DataTransfer();
    transfer.items.add(new File([bytes], `${kind}.png`, { type: "image/png" }));
    const init = { bubbles: true, cancelable: true };
    const event = kind === "paste"
        ? new ClipboardEvent("paste", { ...init, clipboardData: transfer })
        : new DragEvent("drop", { ...init, dataTransfer: transfer });
    (kind === "paste" ? document.querySelector("#prompt") : document.querySelector("main"))
        .dispatchEvent(event);
}"""


def test_pictures_go_to_a_vision_model_and_stay_in_the_conversation(
    vision_server: ServerProcess, page: sync_api.Page
) -> None:
    expect = sync_api.expect
    pngs = [_png(seed) for seed in range(3)]
    urls = ["data:image/png;base64," + base64.b64encode(png).decode() for png in pngs]
    page.goto(vision_server.url + "/")
    expect(page.locator("#model")).to_have_value("llava")
    expect(page.locator("#attach")).to_be_enabled()

    page.click("#settings-toggle")
    page.fill("#max-tokens", "6")
    page.fill("#extra", '{"ignore_eos": true}')
    # One picked, one pasted, one dropped and then removed again.
    page.set_input_files(
        "#file", files=[{"name": "a.png", "mimeType": "image/png", "buffer": pngs[0]}]
    )
    thumbs = page.locator("#attachments .thumb")
    expect(thumbs).to_have_count(1)
    page.evaluate(CARRY, [base64.b64encode(pngs[1]).decode(), "paste"])
    expect(thumbs).to_have_count(2)
    page.evaluate(CARRY, [base64.b64encode(pngs[2]).decode(), "drop"])
    expect(thumbs).to_have_count(3)
    page.locator("#attachments .remove").nth(2).click()
    expect(thumbs).to_have_count(2)

    page.fill("#prompt", "What is in these pictures?")
    with page.expect_request("**/v1/chat/completions") as request:
        page.press("#prompt", "Enter")
    [turn] = request.value.post_data_json["messages"]
    # The pictures as they were, bytes unchanged, as OpenAI image_url parts after the text.
    assert turn["content"] == [
        {"type": "text", "text": "What is in these pictures?"},
        {"type": "image_url", "image_url": {"url": urls[0]}},
        {"type": "image_url", "image_url": {"url": urls[1]}},
    ]
    expect(page.locator("#attachments")).to_be_hidden()
    question = page.locator(".message.user").nth(0)
    expect(question.locator(".thumb")).to_have_count(2)
    assert question.locator(".thumb").nth(1).get_attribute("src") == urls[1]
    answer = page.locator(".message.assistant").nth(0)
    expect(answer.locator(".stats")).to_contain_text("6 tokens", timeout=60_000)
    assert answer.locator(".body").inner_text().strip()

    # The next turn, text only, carries the pictured turn again (the API keeps no state).
    page.fill("#prompt", "And the colours?")
    with page.expect_request("**/v1/chat/completions") as request:
        page.press("#prompt", "Enter")
    messages = request.value.post_data_json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[0] == turn and messages[2]["content"] == "And the colours?"
    expect(page.locator(".message.assistant").nth(1).locator(".stats")).to_contain_text(
        "6 tokens", timeout=60_000
    )

    # A text-only model: the control is off and says why; a pasted picture is refused.
    page.select_option("#model", "tiny")
    expect(page.locator("#attach")).to_be_disabled()
    expect(page.locator("#attach")).to_have_attribute("title", re.compile("tiny takes text only"))
    page.evaluate(CARRY, [base64.b64encode(pngs[0]).decode(), "paste"])
    expect(page.locator("#status")).to_contain_text("tiny takes text only")
    expect(page.locator("#attachments")).to_be_hidden()
