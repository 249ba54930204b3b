"""Every tool-call format through the real server, grammar and parser: one server hosts a tiny
random-weight Llama per format (the default tokenizer with the families' control tokens added),
each served with the family's chat template and its format by the per-model options
(`:chat-template=...,tools=...`; half leave `tools` to auto, which reads the template). A forced
call (named, or required), streamed and not, comes back through the OpenAI SDK as a call whose
arguments validate; Mistral's 9-character call id goes back through its template. The Harmony
model's template shows the analysis channel too: its thinking (ended by the budget) comes
back apart, then the call on the commentary channel."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from tool_format_templates import SPECIAL_TOKENS, TEMPLATES

from http_server_process import ServerProcess, run_server
from tiny_models import build_tiny_model
from trio_llm.model_files import ModelSource, load_tokenizer

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
    },
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}
SERVED = ("mistral", "pythonic", "qwen3_coder", "openai")
"""One format of each reader (JSON calls, a Python list, calls between markers), two of them
with special-token markers: an engine each is what the server's start costs. Granite and
DeepSeek-V3 share their readers' code and are covered by the parser and grammar tests."""
EXPLICIT = {"mistral", "openai"}
"""The formats named by the `tools=` option; the others are left to auto."""


@pytest.fixture(scope="module")
def model(tokenizer_source: ModelSource, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_tokenizer(tokenizer_source)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    root = tmp_path_factory.mktemp("tool-formats-model")
    return build_tiny_model(root / "model", tokenizer, LlamaConfig, LlamaForCausalLM)


@pytest.fixture(scope="module")
def server(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("tool-formats")
    entries = []
    for format in SERVED:
        template = HARMONY_THINKING if format == "openai" else TEMPLATES[format]
        path = root / f"{format}.jinja"
        path.write_text(template)
        tools = f",tools={format}" if format in EXPLICIT else ""
        entries.append(f"{model}:name={format},chat-template={path}{tools},max-len=1024")
    with run_server(
        *entries,
        "--max-num-seqs", "2",
        "--kv-cache-memory", "16MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "2",
    ) as s:  # fmt: skip
        yield s


@pytest.fixture(scope="module")
def sdk(server: ServerProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0) as client:
        yield client


HARMONY_THINKING = TEMPLATES["openai"].replace(
    "<|start|>assistant<|channel|>final<|message|>",
    "<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>",
)
"""gpt-oss's template shows the analysis channel: auto reads its thinking too (`openai`)."""
BUDGET = 6


def ask(sdk: openai.OpenAI, format: str, **fields: Any) -> Any:
    if format == "openai":  # a random model thinks on: the budget ends its analysis channel
        fields.setdefault("extra_body", {"thinking_token_budget": BUDGET})
    request = {
        "model": format,
        "messages": QUESTION,
        "tools": TOOLS,
        "tool_choice": NAMED,
        "max_tokens": 80,
        "temperature": 0,
        **fields,
    }
    return sdk.chat.completions.create(**request)


def check_call(format: str, call_id: str, name: str, arguments: str) -> None:
    assert name == "get_weather"
    jsonschema.validate(json.loads(arguments), WEATHER)
    if format == "mistral":
        assert len(call_id) == 9 and call_id.isalnum()
    else:
        assert call_id.startswith("call_")


@pytest.mark.parametrize("format", SERVED)
def test_a_forced_call_comes_back_whole_and_streamed(sdk: openai.OpenAI, format: str) -> None:
    choice = ask(sdk, format).choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    assert not choice.message.content
    [call] = choice.message.tool_calls
    check_call(format, call.id, call.function.name, call.function.arguments)
    thought = (choice.message.model_extra or {}).get("reasoning_content")
    if format == "openai":  # the analysis channel, apart, and no header left in it
        assert thought is not None and "<|" not in thought
    else:
        assert thought is None

    calls: dict[int, dict[str, str]] = {}
    content, finish = "", None
    for chunk in ask(sdk, format, tool_choice="required", parallel_tool_calls=False, stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            finish = c.finish_reason or finish
            for delta in c.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
                entry["id"] += delta.id or ""
                entry["name"] += (delta.function and delta.function.name) or ""
                entry["arguments"] += (delta.function and delta.function.arguments) or ""
    assert finish == "tool_calls" and not content.strip()
    [streamed] = calls.values()
    if streamed["name"] == "now":  # required: either tool
        json.loads(streamed["arguments"])
    else:
        check_call(format, streamed["id"], streamed["name"], streamed["arguments"])


def test_mistral_ids_go_back_through_its_template(sdk: openai.OpenAI) -> None:
    """Mistral's templates refuse a call id that is not 9 letters and digits."""
    first = ask(sdk, "mistral").choices[0].message
    [call] = first.tool_calls
    messages: list[Any] = [
        *QUESTION,
        first.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"sky": "sunny"}'},
    ]
    reply = ask(sdk, "mistral", messages=messages, tool_choice="none", max_tokens=4)
    assert reply.choices[0].finish_reason in ("stop", "length")


def test_each_model_renders_with_its_own_template(server: ServerProcess) -> None:
    """The same weights under four names, each with its own template (`chat-template=`)."""
    body = {"messages": QUESTION, "add_generation_prompt": True}
    for format, mark in (("mistral", "[INST]"), ("openai", "You are a helpful assistant.")):
        ids = httpx.post(
            server.url + "/tokenize", json={**body, "model": format}, timeout=30
        ).json()["tokens"]
        text = httpx.post(
            server.url + "/detokenize", json={"model": format, "tokens": ids}, timeout=30
        ).json()["prompt"]
        assert mark in text


# What each template makes of the call and of its result in the second turn's prompt.
RENDERED = {
    "mistral": ("[TOOL_CALLS]get_weather[ARGS]{ARGS}", "[TOOL_RESULTS]{RESULT}[/TOOL_RESULTS]"),
    "pythonic": (
        '<|im_start|>assistant[get_weather(city="{CITY}", days={DAYS})]<|im_end|>',
        "<|im_start|>tool{RESULT}<|im_end|>",
    ),
    "qwen3_coder": (
        "<function=get_weather><parameter=city>\n{CITY}\n</parameter>"
        "<parameter=days>\n{DAYS}\n</parameter></function>",
        "<|im_start|>tool{RESULT}<|im_end|>",
    ),
}
"""(The test templates' ChatML runs under the chat templates' trim_blocks: no newline after
the role.)"""


@pytest.mark.parametrize("format", sorted(RENDERED))
def test_an_agent_loop_sends_the_result_back_through_the_template(
    sdk: openai.OpenAI, model: Path, format: str
) -> None:
    """The loop agent frameworks run (the OpenAI Agents SDK, LangChain's bind_tools; both
    tried outside the suite): a forced call, the tool's result as a `tool` message, then a
    plain turn with the tools still offered. The call and its result reach the model written
    as the family's template writes them (the arguments as an object again)."""
    from transformers import AutoTokenizer

    first = ask(sdk, format).choices[0]  # the named function: a random model may pick `now`
    assert first.finish_reason == "tool_calls", first.message
    [call] = first.message.tool_calls
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, WEATHER)
    result = f"Sunny, 21 C in {arguments['city']} for {arguments['days']} days"
    messages: list[Any] = [
        *QUESTION,
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": result},
    ]
    second = ask(
        sdk, format, messages=messages, tool_choice="auto", max_tokens=8,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    prompt = AutoTokenizer.from_pretrained(model).decode(second.prompt_token_ids)
    fill = {
        "{ARGS}": json.dumps(arguments),
        "{CITY}": arguments["city"],
        "{DAYS}": str(arguments["days"]),
        "{RESULT}": result,
    }
    for part in RENDERED[format]:
        for key, value in fill.items():
            part = part.replace(key, value)
        assert part in prompt, (part, prompt)
    assert prompt.index(result) > prompt.index("get_weather")
