"""`trio-llm chat` under a pseudo-terminal (pexpect), as a person types it: with the tiny model
run in-process and with a real server on loopback (--url). Ctrl-C stops a streaming reply and
the chat goes on (over HTTP the server's running count drops to 0); /system, /reset and /set
change what the next request carries (seen in the prompt's token count); readline recalls
lines and keeps them between sessions; /image attaches a picture to the next message (a tiny
LLaVA: the picture changes the answer) and is refused for a text-only model."""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from http_server_process import ServerProcess, run_small_server
from trio_llm.model_files import ModelSource, load_tokenizer
from vision_models import IMAGE_TOKENS, build_tiny_llava, picture

pexpect = pytest.importorskip("pexpect", reason="pexpect is not installed (the `test` extra)")

KEY = "chat-key"
PROMPT = ">>> "
NUMBERS = re.compile(r"\[≈?(\d+) tokens?[^\]\n]*\]")  # the line after each reply
UP = "\x1b[A"


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path) -> Iterator[ServerProcess]:
    with run_small_server(tiny_model_dir, "--api-key", KEY) as s:
        yield s


def spawn(tmp_path: Path, *args: str) -> pexpect.spawn:
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(tmp_path),
        "TERM": "xterm",
        "NO_COLOR": "1",
        "TRIO_LLM_API_KEY": "",
    }
    child = pexpect.spawn(
        sys.executable,
        ["-m", "trio_llm", "chat", *args],
        env=env,
        encoding="utf-8",
        timeout=60,
        dimensions=(50, 400),
        preexec_fn=_sigint_default,
    )
    return child


def _sigint_default() -> None:
    """Ctrl-C reaches the chat as in a terminal, however the suite was started (a background
    job of a non-interactive shell inherits SIGINT ignored, and so would the chat)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def ask(child: pexpect.spawn, text: str) -> tuple[int, int | None]:
    """Send `text`, wait for the reply's numbers; (tokens, prompt tokens)."""
    child.sendline(text)
    child.expect(NUMBERS)
    prompt = re.search(r"prompt (\d+) tokens", child.match.group(0))
    tokens = int(child.match.group(1))
    child.expect(PROMPT)
    return tokens, None if prompt is None else int(prompt.group(1))


def stop_a_long_reply(child: pexpect.spawn, on_streaming=lambda: None) -> None:  # type: ignore[no-untyped-def]
    # Greedy: a sampled reply of the random model ends at its EOS token within 1,500 tokens
    # about one time in thirty (1,500 draws at ~1/49,152 each), before Ctrl-C can stop it.
    child.sendline("/set temperature 0")
    child.expect(PROMPT)
    child.sendline("/set max_tokens 1500")
    child.expect(PROMPT)
    child.sendline("Tell me a very long story.")
    child.expect_exact("Tell me a very long story.")  # the terminal's echo
    # The reply is streaming: 200 characters of it, whatever they are (a greedy reply of the
    # random model need not hold a run of 40 characters without a space: once it did not).
    child.expect(r"[\s\S]{200}")
    on_streaming()
    child.sendintr()
    child.expect(NUMBERS)
    assert "stopped" in child.match.group(0)
    child.expect(PROMPT)


def test_chat_in_process(tmp_path: Path, tiny_model_dir: Path) -> None:
    child = spawn(
        tmp_path,
        str(tiny_model_dir),
        "--temperature", "0",
        "--max-tokens", "4",
        "--dtype", "float32",
        "--kv-cache-memory", "32MiB",
        "--num-threads", "1",
    )  # fmt: skip
    child.expect("chatting with tiny-llama")
    child.expect(PROMPT)

    tokens, first = ask(child, "Hi")
    assert tokens <= 4 and first is not None
    _, second = ask(child, "Hi")
    assert second is not None and second > first + tokens  # the first turn came along
    child.sendline("/reset")
    child.expect(r"\(conversation cleared\)")
    assert ask(child, "Hi")[1] == first
    child.sendline("/system You are a pirate who answers in rhymes and nothing else.")
    child.expect(r"\(system prompt set\)")
    child.sendline("/reset")
    _, pirate = ask(child, "Hi")
    assert pirate is not None and pirate != first

    stop_a_long_reply(child)
    child.sendline("/set max_tokens 3")
    child.expect(PROMPT)
    assert ask(child, "Still there?")[0] <= 3  # the chat goes on after a stop

    child.sendintr()  # at the prompt: clears the line, does not leave
    child.expect(r"Ctrl-D or /exit leaves")
    child.sendline("/nope")
    child.expect("unknown command /nope")
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_chat_over_http(tmp_path: Path, server: ServerProcess) -> None:
    refused = spawn(tmp_path, "--url", server.url)
    refused.expect(r"401: .*--api-key")
    refused.expect(pexpect.EOF)
    refused.close()
    assert refused.exitstatus == 1

    child = spawn(tmp_path, "--url", server.url, "--api-key", KEY, "--max-tokens", "5")
    child.expect(rf"chatting with tiny-llama\S* \({re.escape(server.url)}\)")
    child.expect(PROMPT)
    tokens, first = ask(child, "Hello")
    assert tokens <= 5 and first is not None
    assert ask(child, "Hello")[1] > first  # type: ignore[operator]

    stop_a_long_reply(child, lambda: server.wait_running(1))
    deadline = time.monotonic() + 5
    while server.metrics()["trio_llm_num_requests_running"] != 0:
        assert time.monotonic() < deadline, "the stopped reply still runs in the engine"
        time.sleep(0.02)
    assert server.wait_idle(5.0)["trio_llm_num_requests_running"] == 0

    # readline: the up arrow brings back the last line; history outlives the session.
    child.sendline("/set temperature 0.5")
    child.expect(r"\(temperature = 0.5\)")
    child.expect(PROMPT)
    child.send(UP + "\r")
    child.expect(r"\(temperature = 0.5\)")
    child.expect(PROMPT)
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    history = (tmp_path / "trio-llm" / "chat_history").read_text().splitlines()
    # (readline does not add a line that repeats the one before it)
    assert history == [
        "Hello",
        "/set temperature 0",
        "/set max_tokens 1500",
        "Tell me a very long story.",
        "/set temperature 0.5",
        "/exit",
    ]


def test_model_and_url_exclude_each_other(tmp_path: Path) -> None:
    child = spawn(tmp_path, "some-model", "--url", "http://127.0.0.1:1")
    child.expect("give a MODEL or --url, not both")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 2


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource) -> Path:
    path = tmp_path_factory.mktemp("tiny-llava")
    build_tiny_llava(path, load_tokenizer(tokenizer_source))
    return path


def reply_to(child: pexpect.spawn, text: str) -> tuple[str, int]:
    """Send `text`; the reply's text and its prompt's token count."""
    child.sendline(text)
    child.expect(NUMBERS)
    reply = child.before.split(text, 1)[-1].strip()
    prompt = re.search(r"prompt (\d+) tokens", child.match.group(0))
    assert prompt is not None
    child.expect(PROMPT)
    return reply, int(prompt.group(1))


def attach(child: pexpect.spawn, path: Path) -> None:
    child.sendline(f"/image {path}")
    child.expect(rf"\({re.escape(path.name)} attached to your next message\)")
    child.expect(PROMPT)


def test_image_goes_with_the_next_message(tmp_path: Path, llava_dir: Path) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    picture(0).save(a)
    picture(1).save(b)
    (tmp_path / "notes.txt").write_text("not a picture")
    child = spawn(
        tmp_path,
        str(llava_dir),
        "--temperature", "0",
        "--max-tokens", "6",
        "--dtype", "float32",
        "--kv-cache-memory", "32MiB",
        "--num-threads", "1",
    )  # fmt: skip
    child.expect("chatting with tiny-llava")
    child.expect(PROMPT)
    question = "What is in it?"
    _, text_only = reply_to(child, question)
    child.sendline("/reset")
    child.expect(r"\(conversation cleared\)")

    attach(child, a)
    answer_a, with_picture = reply_to(child, question)
    # One marker, expanded into 16, and the newline the server too puts between parts.
    assert with_picture == text_only + IMAGE_TOKENS + 1
    _, later = reply_to(child, "And then?")
    assert later > with_picture + 6, "the picture's turn stays in the history"
    for path in (b, a):
        child.sendline("/reset")
        child.expect(r"\(conversation cleared\)")
        attach(child, path)
        answer, _ = reply_to(child, question)
        assert (answer == answer_a) == (path == a), "the picture decides the greedy answer"

    child.sendline(f"/image {tmp_path / 'notes.txt'}")
    child.expect(r"not a picture by its name")
    child.sendline(f"/image {tmp_path / 'missing.png'}")
    child.expect(r"cannot read .*missing.png")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_image_is_refused_for_a_text_only_model(tmp_path: Path, server: ServerProcess) -> None:
    picture(0).save(tmp_path / "a.png")
    child = spawn(tmp_path, "--url", server.url, "--api-key", KEY, "--max-tokens", "3")
    child.expect(PROMPT)
    child.sendline(f"/image {tmp_path / 'a.png'}")
    child.expect(r"/image: tiny-llama\S* takes text only")
    child.expect(PROMPT)
    _, prompt = reply_to(child, "Hello")  # nothing was attached
    assert prompt < IMAGE_TOKENS + 20
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
