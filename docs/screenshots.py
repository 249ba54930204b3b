"""Take the README's screenshots of the chat page: a real headless chromium (Debian's) against
real servers with the default model, one as the README starts it and one with a key:

    trio-llm serve &  trio-llm serve --port 8001 --api-key demo-key &
    python docs/screenshots.py http://127.0.0.1:8000 http://127.0.0.1:8001 demo-key

Writes docs/chat-page.png (a finished conversation, from the first) and docs/chat-page-dark.png
(the key asked for, settings open, a reply streaming, the Stop button, from the second). Needs
playwright (the `test` extra) and /usr/bin/chromium.
"""

from __future__ import annotations

import sys
from pathlib import Path

from playwright.sync_api import Page, sync_playwright

HERE = Path(__file__).parent
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def open_page(browser, url: str, scheme: str, key: str | None = None) -> Page:  # type: ignore[no-untyped-def]
    page = browser.new_context(
        viewport={"width": 960, "height": 720}, color_scheme=scheme
    ).new_page()
    page.set_default_timeout(600_000)  # a busy 2-core machine is slow
    page.goto(url + "/")
    if key is not None:
        page.fill("#api-key", key)
        page.press("#api-key", "Enter")
    page.locator("#model option").first.wait_for(state="attached")
    return page


def ask(page: Page, text: str, index: int) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    page.locator(".message.assistant").nth(index).locator(".stats").wait_for()


def main(url: str, keyed_url: str, key: str) -> None:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
        page = open_page(browser, url, "light")
        page.click("#settings-toggle")
        page.fill("#temperature", "0")
        page.fill("#max-tokens", "120")
        page.click("#settings-toggle")
        ask(page, "Write a Python function that checks whether a number is prime.", 0)
        ask(page, "What is the capital of France? One sentence.", 1)
        page.screenshot(path=HERE / "chat-page.png")

        page = open_page(browser, keyed_url, "dark", key)
        page.click("#settings-toggle")
        page.fill("#temperature", "0.7")
        page.fill("#system", "You are a concise assistant.")
        page.fill("#prompt", "Give me three tips for writing clear code, as a list.")
        page.press("#prompt", "Enter")
        reply = page.locator(".message.assistant .body")
        while len(reply.text_content() or "") < 160:
            page.wait_for_timeout(50)
        page.screenshot(path=HERE / "chat-page-dark.png")
        page.click("#stop")
        browser.close()


if __name__ == "__main__":
    main(sys.argv[1].rstrip("/"), sys.argv[2].rstrip("/"), sys.argv[3])
