"""Pictures in chat, through the real server (`python -m trio_llm serve`) on a tiny random
LLaVA and the official OpenAI SDK: a data: URL and an http URL served on loopback give
transformers' own greedy answer on that picture; each way a picture cannot be had is a 400
naming its part; /v1/models says which inputs each model takes."""

from __future__ import annotations

import base64
import io
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
import torch

from http_server_process import ServerProcess, run_server
from trio_llm.model_files import ModelSource, load_tokenizer
from vision_models import IMAGE_TOKENS, build_tiny_llava, picture

MAX_TOKENS = 8
SLOW = "/slow.png"


def _png(seed: int) -> bytes:
    out = io.BytesIO()
    picture(seed).save(out, format="PNG")
    return out.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


class _Pictures(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == SLOW:
            time.sleep(3)
        body = _png(int(self.path.strip("/").split(".")[0])) if self.path != SLOW else _png(0)
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def pictures_port() -> Iterator[int]:
    """A tiny http.server thread on loopback serving /<seed>.png (and a slow one)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Pictures)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def llava(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_source: ModelSource
) -> tuple[Path, Any]:
    path = tmp_path_factory.mktemp("tiny-llava")
    return path, build_tiny_llava(path, load_tokenizer(tokenizer_source))


@pytest.fixture(scope="module")
def server(llava: tuple[Path, Any]) -> Iterator[ServerProcess]:
    with run_server(
        str(llava[0]),
        "--served-model-name", "llava",
        "--max-num-seqs", "4",
        "--kv-cache-memory", "32MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "2",
        "--allowed-media-domains", "localhost",
        "--media-fetch-timeout", "1",
        "--limit-mm-per-prompt", '{"image": 2}',
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


def _ask(sdk: openai.OpenAI, *urls: str, text: str = "What is in this picture?") -> str:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}]
    content += [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    reply = sdk.chat.completions.create(
        model="llava",
        messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def _hf_answer(llava: tuple[Path, Any], server: ServerProcess, seed: int) -> str:
    """transformers' greedy answer on the server's own rendered prompt and the same picture."""
    import httpx
    from transformers import AutoProcessor

    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": _data_url(_png(seed))}},
    ]
    body = {"model": "llava", "messages": [{"role": "user", "content": content}]}
    rendered = httpx.post(server.url + "/v1/chat/completions/render", json=body, timeout=30)
    assert rendered.status_code == 200, rendered.text
    ids = rendered.json()["token_ids"]
    processor = AutoProcessor.from_pretrained(llava[0], use_fast=False)
    pixels = processor.image_processor(images=[picture(seed)], return_tensors="pt")["pixel_values"]
    with torch.inference_mode():
        out = llava[1].generate(
            input_ids=torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pixel_values=pixels,
            max_new_tokens=MAX_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
    return processor.tokenizer.decode(out[0, len(ids) :], skip_special_tokens=True)


def test_a_data_url_gives_transformers_answer_on_the_picture(
    sdk: openai.OpenAI, server: ServerProcess, llava: tuple[Path, Any]
) -> None:
    answers = [_ask(sdk, _data_url(_png(seed))) for seed in (0, 1)]
    assert answers[0] == _hf_answer(llava, server, 0)
    assert answers[1] == _hf_answer(llava, server, 1)
    assert answers[0] != answers[1], "two pictures, the same text"


def test_an_http_url_is_fetched_by_the_server(sdk: openai.OpenAI, pictures_port: int) -> None:
    fetched = _ask(sdk, f"http://localhost:{pictures_port}/1.png")
    assert fetched == _ask(sdk, _data_url(_png(1)))


def _refusal(sdk: openai.OpenAI, *urls: str) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        _ask(sdk, *urls)
    return caught.value


def test_each_way_a_picture_cannot_be_had_is_a_400_naming_its_part(
    sdk: openai.OpenAI, pictures_port: int
) -> None:
    part = "messages[0].content[1].image_url"
    unreadable = _refusal(sdk, _data_url(b"not a picture at all"))
    assert unreadable.body["param"] == part  # type: ignore[index]
    assert "cannot read the image" in unreadable.message
    outside = _refusal(sdk, f"http://127.0.0.1:{pictures_port}/0.png")
    assert outside.body["param"] == part  # type: ignore[index]
    assert "allowed media domains" in outside.message
    slow = _refusal(sdk, f"http://localhost:{pictures_port}{SLOW}")
    assert "timed out" in slow.message and slow.body["param"] == part  # type: ignore[index]
    local = _refusal(sdk, "file:///etc/hostname")
    assert "--allowed-local-media-path" in local.message
    three = _refusal(sdk, *[_data_url(_png(i)) for i in range(3)])
    assert three.body["param"] == "messages[0].content[3].image_url"  # type: ignore[index]
    assert "--limit-mm-per-prompt" in three.message


def test_models_say_which_inputs_each_takes(sdk: openai.OpenAI) -> None:
    [card] = sdk.models.list().data
    assert card.model_extra is not None
    assert card.model_extra["input_modalities"] == ["text", "image"]


def test_a_picture_for_a_text_model_is_a_400(tiny_model_dir: Path) -> None:
    with (
        run_server(
            str(tiny_model_dir),
            "--served-model-name",
            "tiny",
            "--max-num-seqs",
            "2",
            "--kv-cache-memory",
            "8MiB",
            "--dtype",
            "float32",
            "--shutdown-timeout",
            "2",
        ) as text_server,  # fmt: skip
        openai.OpenAI(base_url=text_server.url + "/v1", api_key="none", max_retries=0) as sdk,
    ):
        [card] = sdk.models.list().data
        assert card.model_extra is not None and card.model_extra["input_modalities"] == ["text"]
        content = [
            {"type": "text", "text": "hi"},
            {"type": "image_url", "image_url": {"url": _data_url(_png(0))}},
        ]
        with pytest.raises(openai.BadRequestError) as caught:
            sdk.chat.completions.create(
                model="tiny",
                messages=[{"role": "user", "content": content}],  # type: ignore[list-item]
                max_tokens=2,
            )
        assert caught.value.body["param"] == "messages[0].content[1].image_url"  # type: ignore[index]
        assert "takes text only" in caught.value.message


def test_anthropic_image_blocks_take_the_same_path(
    server: ServerProcess, pictures_port: int
) -> None:
    import anthropic

    def ask(client: anthropic.Anthropic, source: dict[str, Any]) -> str:
        reply = client.messages.create(
            model="llava",
            max_tokens=MAX_TOKENS,
            extra_body={"temperature": 0},
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image", "source": source},  # type: ignore[list-item, misc]
                    ],
                }
            ],
        )
        return "".join(b.text for b in reply.content if b.type == "text")

    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0) as client:
        data = base64.b64encode(_png(1)).decode()
        inline = ask(client, {"type": "base64", "media_type": "image/png", "data": data})
        fetched = ask(client, {"type": "url", "url": f"http://localhost:{pictures_port}/1.png"})
        assert inline == fetched
        other = base64.b64encode(_png(0)).decode()
        assert inline != ask(client, {"type": "base64", "media_type": "image/png", "data": other})
        image = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": data},
        }
        counted = client.messages.count_tokens(
            model="llava",
            messages=[{"role": "user", "content": [image]}],  # type: ignore[list-item]
        )
        assert counted.input_tokens > IMAGE_TOKENS, "a picture counts its placeholders"
        with pytest.raises(anthropic.BadRequestError, match=r"messages\[0\]\.content\[1\]\.source"):
            ask(client, {"type": "base64", "media_type": "image/png", "data": "bm90IGFuIGltYWdl"})


def test_a_screenshot_in_a_tool_result_reaches_the_model(server: ServerProcess) -> None:
    """The anthropic SDK's tool loop with a picture in the tool_result (computer use, MCP
    screenshot tools): the picture decides the answer, and counts its placeholders."""
    import anthropic

    def messages(seed: int) -> list[Any]:
        shot = base64.b64encode(_png(seed)).decode()
        source = {"type": "base64", "media_type": "image/png", "data": shot}
        call = {"type": "tool_use", "id": "toolu_1", "name": "screenshot", "input": {}}
        result = {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": [{"type": "image", "source": source}],
        }
        return [
            {"role": "user", "content": "What is on my screen?"},
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]

    tools: list[Any] = [
        {"name": "screenshot", "description": "The screen.", "input_schema": {"type": "object"}}
    ]
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0) as client:

        def ask(seed: int) -> str:
            reply = client.messages.create(
                model="llava",
                max_tokens=MAX_TOKENS,
                extra_body={"temperature": 0},
                tools=tools,
                messages=messages(seed),
            )
            return "".join(b.text for b in reply.content if b.type == "text")

        assert ask(0) != ask(1), "the screenshot decides the answer"
        assert ask(1) == ask(1)
        with_picture = client.messages.count_tokens(
            model="llava", tools=tools, messages=messages(0)
        ).input_tokens
        without = messages(0)
        without[-1]["content"][0]["content"] = [{"type": "text", "text": "x"}]
        alone = client.messages.count_tokens(model="llava", tools=tools, messages=without)
        assert with_picture >= alone.input_tokens + IMAGE_TOKENS - 1


def test_responses_input_image_takes_the_same_path(sdk: openai.OpenAI) -> None:
    url = _data_url(_png(1))
    content = [
        {"type": "input_text", "text": "What is in this picture?"},
        {"type": "input_image", "image_url": url, "detail": "auto"},
    ]
    reply = sdk.responses.create(
        model="llava",
        input=[{"role": "user", "content": content}],  # type: ignore[list-item, misc]
        max_output_tokens=MAX_TOKENS,
        temperature=0,
    )
    assert reply.output_text == _ask(sdk, url), "the same conversation as chat's"
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(
            model="llava",
            input=[
                {"role": "user", "content": [{"type": "input_image", "image_url": "data:x"}]}  # type: ignore[list-item, misc]
            ],
            max_output_tokens=2,
        )
    assert caught.value.body["param"] == "input[0].content[0].image_url"  # type: ignore[index]


def test_the_same_picture_in_a_later_turn_is_a_prefix_cache_hit(
    sdk: openai.OpenAI, server: ServerProcess
) -> None:
    """cached_tokens reaches past the picture's placeholders for the same picture, and stops
    before them for another behind the same text."""
    import httpx

    text = "A preamble long enough to fill a block of the cache on its own, and then: look."

    def turn(seed: int) -> list[dict[str, Any]]:
        url = _data_url(_png(seed))
        content = [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": url}}]
        return [{"role": "user", "content": content}]

    body = {"model": "llava", "messages": turn(0)}
    ids = httpx.post(server.url + "/v1/chat/completions/render", json=body, timeout=30).json()
    image_token = max(ids["token_ids"])  # the added <image>, the vocabulary's last token
    marks = [k for k, t in enumerate(ids["token_ids"]) if t == image_token]
    first, last = marks[0], marks[-1]

    def ask(messages: list[dict[str, Any]]) -> Any:
        return sdk.chat.completions.create(
            model="llava",
            messages=messages,
            max_tokens=4,
            temperature=0,  # type: ignore[arg-type]
        )

    answer = ask(turn(0)).choices[0].message.content
    later = [
        *turn(0),
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "More?"},
    ]
    again = ask(later).usage
    assert again is not None and again.prompt_tokens_details is not None
    assert again.prompt_tokens_details.cached_tokens > last
    other = ask([*turn(1), *later[1:]]).usage
    assert other is not None and other.prompt_tokens_details is not None
    assert other.prompt_tokens_details.cached_tokens <= first
