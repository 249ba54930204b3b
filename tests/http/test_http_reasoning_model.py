"""Reasoning end to end on real models, through the server as a user runs it.

- The default model (SmolLM2-135M-Instruct) behind a chat template that opens the think block
  itself (DeepSeek-R1's way; `enable_thinking: false` closes it instead, Qwen3's way): it never
  learned to close the block, so the thinking budget is what ends it, and the answer's schema
  (response_format, tools, output_config) applies after the forced closing tag. The constrained
  path end to end: the thinking comes back apart, the answer validates.
- A tiny random-weight Qwen3 with `<think>`/`</think>` as single added tokens and a Qwen3-style
  template that leaves opening the block to the model: the grammar makes it open the block,
  ends it at the budget with the one closing token, and the schema holds after it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from http_server_process import ServerProcess, run_server, run_small_server
from tiny_models import build_tiny_model
from trio_llm.model_files import ModelSource, load_tokenizer

pytestmark = pytest.mark.slow


def chatml_template(*, opens: bool) -> str:
    """A ChatML template that reads enable_thinking: false writes an empty think block into the
    prompt (Qwen3's way); otherwise it opens the block itself (`opens`, DeepSeek-R1's way) or
    leaves that to the model (Qwen3's)."""
    opening = "{% else %}<think>\n" if opens else ""
    return (
        "{%- for message in messages -%}<|im_start|>{{ message.role }}\n"
        "{{ message.content }}<|im_end|>\n{% endfor -%}"
        "{%- if add_generation_prompt -%}<|im_start|>assistant\n"
        "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
        f"{opening}{{% endif -%}}{{%- endif -%}}"
    )


THINKING_TEMPLATE = chatml_template(opens=True)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}
QUESTION = [{"role": "user", "content": "Describe a person called Ann, aged 31, as JSON."}]
BUDGET = 12


def thinking_copy(source: ModelSource, path: Path, template: str) -> Path:
    """The model's files, linked, with `template` as its chat template."""
    path.mkdir()
    for item in source.path.iterdir():
        if item.name != "chat_template.jinja":
            (path / item.name).symlink_to(item)
    (path / "chat_template.jinja").write_text(template)
    return path


@pytest.fixture(scope="module")
def server(
    default_model: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    model = thinking_copy(
        default_model, tmp_path_factory.mktemp("thinker") / "thinker", THINKING_TEMPLATE
    )
    with run_server(str(model), "--kv-cache-memory", "64MiB", "--max-model-len", "2048") as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


def tokens(url: str, text: str) -> list[int]:
    body = {"prompt": text, "add_special_tokens": False}
    return httpx.post(url + "/tokenize", json=body, timeout=30).json()["tokens"]


def chat(sdk: openai.OpenAI, **fields: Any) -> Any:
    request = {"model": "thinker", "messages": QUESTION, "max_tokens": 120, "temperature": 0}
    return sdk.chat.completions.create(**{**request, **fields})


def person_format() -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}


def test_a_schema_holds_after_the_budget_ends_the_thinking(
    sdk: openai.OpenAI, server: ServerProcess
) -> None:
    reply = chat(sdk, response_format=person_format(), extra_body={"thinking_token_budget": BUDGET})
    message = reply.choices[0].message
    thought = message.reasoning_content  # type: ignore[attr-defined]
    assert thought and "</think>" not in thought and "<think>" not in thought
    jsonschema.validate(json.loads(message.content), PERSON)
    assert reply.choices[0].finish_reason == "stop"
    # The budget counts the block's tokens, its closing tag among them.
    assert len(tokens(server.url, thought)) <= BUDGET


def test_the_same_streamed(sdk: openai.OpenAI) -> None:
    thought, content = "", ""
    for chunk in chat(
        sdk,
        response_format=person_format(),
        stream=True,
        extra_body={"thinking_token_budget": BUDGET},
    ):
        for choice in chunk.choices:
            thought += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    whole = chat(sdk, response_format=person_format(), extra_body={"thinking_token_budget": BUDGET})
    message = whole.choices[0].message
    assert (thought, content) == (message.reasoning_content, message.content)  # type: ignore[attr-defined]


def test_thinking_turned_off_constrains_from_the_start(sdk: openai.OpenAI) -> None:
    message = chat(sdk, response_format=person_format(), reasoning_effort="none").choices[0].message
    assert message.reasoning_content is None  # type: ignore[attr-defined]
    jsonschema.validate(json.loads(message.content), PERSON)


def test_a_forced_call_comes_after_the_thinking(sdk: openai.OpenAI) -> None:
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}
    message = (
        chat(
            sdk,
            messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=[tool],
            tool_choice="required",
            parallel_tool_calls=False,
            extra_body={"thinking_token_budget": BUDGET},
        )
        .choices[0]
        .message
    )
    assert message.reasoning_content  # type: ignore[attr-defined]
    [call] = message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)


def test_messages_api_thinking_blocks_then_tool_use(server: ServerProcess) -> None:
    with anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0) as client:
        message = client.messages.create(
            model="thinker",
            max_tokens=120,
            messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
            tools=[{"name": "get_weather", "input_schema": WEATHER}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            thinking={"type": "enabled", "budget_tokens": BUDGET},
            extra_body={"temperature": 0},
        )
        with client.messages.stream(
            model="thinker",
            max_tokens=120,
            messages=QUESTION,
            thinking={"type": "enabled", "budget_tokens": BUDGET},
            output_config={"format": {"type": "json_schema", "schema": PERSON}},
            extra_body={"temperature": 0},
        ) as stream:
            kinds = [event.type for event in stream]
            streamed = stream.get_final_message()
    thinking, call = message.content
    assert thinking.type == "thinking" and thinking.thinking and thinking.signature
    assert (call.type, message.stop_reason) == ("tool_use", "tool_use")
    jsonschema.validate(call.input, WEATHER)
    assert "thinking" in kinds and "text" in kinds
    thought, text = streamed.content
    assert thought.type == "thinking" and thought.thinking
    jsonschema.validate(json.loads(text.text), PERSON)


# -- a tiny random-weight Qwen3 -----------------------------------------------------------------

QWEN3_TEMPLATE = chatml_template(opens=False)

FLAGS = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["ok", "n"],
    "additionalProperties": False,
}


def build_tiny_qwen3(path: Path, tokenizer_source: ModelSource) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tokenizer = load_tokenizer(tokenizer_source)
    tokenizer.add_tokens(["<think>", "</think>"])  # single, non-special tokens, as Qwen3's
    tokenizer.chat_template = QWEN3_TEMPLATE
    return build_tiny_model(path, tokenizer, Qwen3Config, Qwen3ForCausalLM)


@pytest.fixture(scope="module")
def tiny(
    tokenizer_source: ModelSource, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    path = build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), tokenizer_source)
    with run_small_server(path, "--served-model-name", "tiny") as server:
        yield server


def test_tiny_qwen3_opens_thinks_within_budget_and_answers_the_schema(
    tiny: ServerProcess,
) -> None:
    client = openai.OpenAI(base_url=tiny.url + "/v1", api_key="none", max_retries=0)
    schema = {"type": "json_schema", "json_schema": {"name": "flags", "schema": FLAGS}}
    for seed in range(3):
        reply = client.chat.completions.create(
            model="tiny",
            messages=QUESTION,
            max_tokens=60,
            seed=seed,
            response_format=schema,
            extra_body={"thinking_token_budget": 6, "return_token_ids": True},
        )
        choice = reply.choices[0]
        jsonschema.validate(json.loads(choice.message.content), FLAGS)
        ids = (choice.model_extra or {})["token_ids"]
        written = httpx.post(tiny.url + "/detokenize", json={"tokens": ids}, timeout=30).json()[
            "prompt"
        ]
        # A random model does not think by itself: the grammar opened the block and the
        # budget closed it.
        assert written.startswith("<think>") and "</think>" in written
        thought = (choice.message.model_extra or {})["reasoning_content"] or ""
        assert "think>" not in thought and "think>" not in choice.message.content
        assert len(tokens(tiny.url, thought)) <= 6
