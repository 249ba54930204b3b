"""Hypothesis strategies for hostile request bodies, shared by the fuzz tests against the fake
engine (tests/http, many examples) and against the real server (tests/reliability, fewer).

Three kinds: a valid body with a few fields replaced by arbitrary JSON (wrong types, huge and
negative numbers, nesting); arbitrary bytes; and a valid body with one field's raw JSON text
replaced by something a JSON parser or a later layer may choke on (invalid UTF-8, lone
surrogates, NaN and Infinity, numbers past any range, nesting 10,000 deep, empty and
enormous message lists).
"""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st

FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "n", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "user",
    "response_format", "tools", "tool_choice", "top_k", "min_p", "repetition_penalty",
    "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
    "include_stop_str_in_output", "add_generation_prompt", "continue_final_message",
    "chat_template_kwargs", "priority", "request_id", "tokens", "suffix", "best_of",
    "bad_words", "allowed_token_ids", "truncate_prompt_tokens", "truncation_side",
    "prompt_logprobs", "return_token_ids", "add_special_tokens", "use_beam_search",
    "structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
    "response_format", "reasoning_effort", "thinking_token_budget", "include_reasoning",
    # /v1/responses
    "input", "instructions", "max_output_tokens", "text", "previous_response_id", "store",
    "include", "reasoning", "background", "metadata", "parallel_tool_calls", "conversation",
    # /v1/messages
    "system", "stop_sequences", "thinking", "output_config",
]  # fmt: skip

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def base_bodies(model: str) -> dict[str, dict[str, Any]]:
    """A small valid body for every POST route."""
    return {
        "/v1/chat/completions": {"model": model, "messages": [{"role": "user", "content": "hi"}]},
        "/v1/completions": {"model": model, "prompt": "hi"},
        "/invocations": {"model": model, "prompt": "hi"},
        "/v1/responses": {"model": model, "input": "hi"},
        "/v1/messages": {
            "model": model,
            "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}],
        },
        "/v1/messages/count_tokens": {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
        },
        "/tokenize": {"prompt": "hi"},
        "/detokenize": {"tokens": [104]},
    }


def mutated_bodies(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`base` with up to four fields set to arbitrary JSON; generations stay short and do not
    stream (a streamed 200 says nothing more about the status)."""

    def build(changes: dict[str, Any]) -> dict[str, Any]:
        body = {**base, **changes, "max_tokens": changes.get("max_tokens", 2)}
        body["max_output_tokens"] = changes.get("max_output_tokens", 2)
        if body.get("stream") is True:
            body["stream"] = False
        return body

    return st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4).map(build)


def _message_list(count: int) -> bytes:
    return b"[" + b",".join([b'{"role": "user", "content": "hi"}'] * count) + b"]"


def _raw_values(enormous: int) -> list[bytes]:
    return [
        b'"\xff\xfe"',  # invalid UTF-8 inside a string
        b'"caf\xc3"',  # a truncated multi-byte sequence
        b"\xff",
        b'"\\ud800"',  # a lone surrogate, escaped
        b'"x\\udfff\\ud800y"',
        b"NaN",
        b"Infinity",
        b"-Infinity",
        b"1e999",
        b"-1e999",
        b"1" + b"0" * 400,
        b"-" + b"9" * 400,
        b"-1",
        b"-2147483649",
        b"9223372036854775808",
        b"0.5",
        b"[" * 10_000 + b"]" * 10_000,
        b'{"a": ' * 5_000 + b"0" + b"}" * 5_000,
        b"true",
        b"null",
        b'"text"',
        b"{}",
        b'[1, "a", null, {}]',
        b"[]",
        _message_list(enormous),
    ]


def spliced_bodies(base: dict[str, Any], *, enormous: int = 50_000) -> st.SearchStrategy[bytes]:
    """`base` as JSON text with one field (top level, or a message's content when there are
    messages) replaced by a raw value from the list above. `enormous` is the length of the
    enormous message list."""
    values = st.sampled_from(_raw_values(enormous))
    fields = st.sampled_from([*FIELDS, "messages.content"])

    def splice(field: str, value: bytes) -> bytes:
        if field == "messages.content":
            rest = {k: v for k, v in base.items() if k != "messages"}
            message = b'{"role": "user", "content": ' + value + b"}"
            return _object(rest, b'"messages": [' + message + b"]")
        rest = {k: v for k, v in base.items() if k != field}
        return _object(rest, json.dumps(field).encode() + b": " + value)

    return st.builds(splice, fields, values)


def _object(fields: dict[str, Any], raw_member: bytes) -> bytes:
    rest = json.dumps(fields).encode()[1:-1]
    return b"{" + raw_member + (b", " + rest if rest else b"") + b"}"
