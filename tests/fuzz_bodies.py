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
import os
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings

FUZZ = os.environ.get("TRIO_LLM_FUZZ", "")
"""How the fuzz tests run (tests/conftest.py loads the matching Hypothesis profile): unset,
derandomized, so that a run passes or fails for a reason and not by chance; `random`, a new
seed each run (`--hypothesis-seed` picks one); `deep`, a new seed and `DEEP_FACTOR` times the
examples. Every body that ever failed is pinned as an explicit example of its test."""
DEEP_FACTOR = int(os.environ.get("TRIO_LLM_FUZZ_FACTOR", "20"))


def fuzz_settings(examples: int) -> settings:
    """A fuzz test's settings: `examples` examples, more in the deep mode."""
    return settings(
        max_examples=examples * DEEP_FACTOR if FUZZ == "deep" else examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )


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
    """A small valid body for every POST route that generates or tokenizes."""
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


def embedding_bodies(model: str) -> dict[str, dict[str, Any]]:
    """A small valid body for every POST route an embedding model serves."""
    return {
        "/v1/embeddings": {"model": model, "input": "hi"},
        "/pooling": {"model": model, "input": "hi"},
        "/invocations": {"model": model, "input": "hi"},
    }


# -- the fields that reach the grammar, tool and template paths ---------------------------------

ASTRAL = "\U000bff35"
"""A character whose first UTF-8 byte (F2) the default model has no token for."""

texts = st.text(max_size=12) | st.sampled_from(
    [ASTRAL, "a" + ASTRAL, "\U0001f600", "", "\\", "/", "[", "(?=a)b", "(a)\\1", "a{999}{999}",
     "\x00", "</tool_call>", "<tool_call>", "{", '"', "\u2028"]
)  # fmt: skip
"""Short texts, and the ones that have broken a grammar or a regex before."""

_deep = '{"type":"array","items":' * 200 + "{}" + "}" * 200
_wide_any_of = {"anyOf": [{"type": "object", "required": [f"k{i}"]} for i in range(2100)]}
_leaf_schemas = (
    st.sampled_from(
        [{"type": t} for t in ("string", "integer", "number", "boolean", "null", "object")]
        + [{}, True, False, {"type": "strin"}, {"$ref": "#/$defs/x"}, {"format": "nope"},
           {"type": "string", "format": "email"}, {"minLength": 5, "maxLength": 2}]
    )
    | st.builds(lambda v: {"const": v}, texts)
    | st.builds(lambda vs: {"enum": vs}, st.lists(texts, max_size=4))
    | st.builds(lambda p: {"type": "string", "pattern": p}, texts)
    | st.builds(lambda lo, hi: {"type": "integer", "minimum": lo, "maximum": hi},
                st.integers(-(2**70), 2**70), st.integers(-(2**70), 2**70))
)  # fmt: skip
schemas = st.recursive(
    _leaf_schemas,
    lambda inner: (
        st.builds(
            lambda props, req: {"type": "object", "properties": props, "required": req},
            st.dictionaries(texts, inner, max_size=3),
            st.lists(texts, max_size=2),
        )
        | st.builds(lambda item: {"type": "array", "items": item}, inner)
        | st.builds(lambda parts: {"anyOf": parts}, st.lists(inner, max_size=3))
    ),
    max_leaves=8,
) | st.sampled_from([json.loads(_deep), _wide_any_of, {"enum": [f"e{i}" for i in range(3000)]}])
"""JSON schemas of every kind, some valid, some not, some past the grammar engine's limits."""

_wide_lark = (
    "start: " + " | ".join(f'"x" r{i}' for i in range(2100)) + "\n"
    + "\n".join(f'r{i}: "y{i}"' for i in range(2100))
)  # fmt: skip
grammars = texts | st.sampled_from(
    ['start: "a"', 'root ::= "x" [0-9]', "start: " + "(" * 300 + '"a"' + ")" * 300, _wide_lark,
     "start: undefined", 'start: "' + ASTRAL + '"']
)  # fmt: skip

constraint_fields = st.one_of(
    st.builds(lambda s: {"guided_json": s}, schemas),
    st.builds(lambda r: {"guided_regex": r}, texts),
    st.builds(lambda c: {"guided_choice": c}, st.lists(texts, max_size=5)),
    st.builds(lambda g: {"guided_grammar": g}, grammars),
    st.builds(lambda s: {"response_format": _json_schema_format(s)}, schemas),
    st.just({"response_format": {"type": "json_object"}}),
    st.builds(lambda s: {"structured_outputs": {"json": s}}, schemas),
    st.builds(lambda r: {"structured_outputs": {"regex": r}}, texts),
    st.builds(lambda c: {"structured_outputs": {"choice": c}}, st.lists(texts, max_size=5)),
    st.builds(lambda g: {"structured_outputs": {"grammar": g}}, grammars),
)  # fmt: skip
"""One structured-output field (chat and completions)."""


def _json_schema_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


_names = st.sampled_from(["f", "get_weather", "now"]) | texts
tool_choices = st.sampled_from(["auto", "required", "none"]) | st.builds(
    lambda n: {"type": "function", "function": {"name": n}}, _names
)
chat_tools = st.lists(
    st.builds(
        lambda n, p: {"type": "function", "function": {"name": n, "parameters": p}}, _names, schemas
    ),
    max_size=3,
)
_calls = st.lists(
    st.builds(
        lambda n, a: {"id": "call_1", "type": "function", "function": {"name": n, "arguments": a}},
        _names,
        texts | st.just('{"city": "Paris"}'),
    ),
    max_size=2,
)
conversations = st.lists(
    st.one_of(
        st.builds(lambda c: {"role": "user", "content": c}, texts),
        st.builds(lambda c: {"role": "system", "content": c}, texts),
        st.builds(lambda calls: {"role": "assistant", "content": "", "tool_calls": calls}, _calls),
        st.builds(lambda c: {"role": "tool", "content": c, "tool_call_id": "call_1"}, texts),
    ),
    min_size=1,
    max_size=4,
)
"""Conversations with tool calls and results, which the template or the server renders."""


def hostile_fields(route: str) -> st.SearchStrategy[dict[str, Any]]:
    """Fields that reach the grammar, tool and template paths of `route`, valid or not."""
    template = st.fixed_dictionaries(
        {}, optional={"chat_template_kwargs": st.dictionaries(texts, json_values, max_size=3)}
    )
    chat = st.one_of(
        constraint_fields,
        st.builds(lambda t, c: {"tools": t, "tool_choice": c}, chat_tools, tool_choices),
        st.builds(
            lambda t, c, f: {"tools": t, "tool_choice": c, **f},
            chat_tools,
            tool_choices,
            constraint_fields,
        ),
        st.builds(lambda m, t: {"messages": m, **t}, conversations, template),
        st.builds(lambda m, t: {"messages": m, "tools": t}, conversations, chat_tools),
    )
    if route in ("/v1/completions", "/invocations"):
        return constraint_fields
    if route == "/v1/chat/completions":
        return chat
    if route == "/v1/responses":
        formats = st.one_of(
            st.builds(lambda s: {"type": "json_schema", "name": "x", "schema": s}, schemas),
            st.just({"type": "json_object"}),
            st.builds(lambda v: {"type": v}, texts),
        )
        tools = st.lists(
            st.builds(
                lambda n, p: {"type": "function", "name": n, "parameters": p}, _names, schemas
            ),
            max_size=3,
        )
        _choices = st.sampled_from(["auto", "required", "none"])
        return st.one_of(
            st.builds(lambda f: {"text": {"format": f}}, formats),
            st.builds(lambda t, c: {"tools": t, "tool_choice": c}, tools, _choices),
            st.builds(lambda t, f: {"tools": t, "text": {"format": f}}, tools, formats),
        )  # fmt: skip
    if route in ("/tokenize", "/v1/embeddings", "/pooling"):
        instead = "prompt" if route == "/tokenize" else "input"
        return st.builds(lambda m, t: {"messages": m, **t, instead: None}, conversations, template)
    return st.just({})


def hostile_bodies(base: dict[str, Any], route: str) -> st.SearchStrategy[dict[str, Any]]:
    """`base` with fields of the grammar, tool and template paths (`hostile_fields`); short,
    unstreamed generations."""

    def build(fields: dict[str, Any]) -> dict[str, Any]:
        body = {**base, **fields, "max_tokens": 2, "max_output_tokens": 2}
        return {k: v for k, v in body.items() if v is not None}

    return hostile_fields(route).map(build)


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


def _deep_object(levels: int) -> str:
    return '{"type":"object","properties":{"a":' * levels + "{}" + "}}" * levels


PINNED: list[tuple[str, bytes]] = [
    # The issue's body: U+BFF35 starts with F2, a byte the default model has no token for; the
    # mask let the lone byte BF through (a 500 carrying llguidance's parser state).
    ("/v1/completions", b'{"prompt": "Hi", "guided_regex": "\\udabf\\udf35", "max_tokens": 2}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":'
     b' {"enum": ["\\udabf\\udf35"]}}}}'),
    # Wider than llguidance's 2000 items in a row: accepted, then failed by the engine.
    ("/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2, "guided_choice": [
        f"choice number {i}" for i in range(2100)]}).encode()),
    ("/v1/completions", json.dumps({"prompt": "Hi", "max_tokens": 2, "guided_json": {"anyOf": [
        {"type": "object", "required": [f"k{i}"]} for i in range(2100)]}}).encode()),
    # Nested past the grammar engine's reader (an internal error), and past Python's recursion.
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": 2, "guided_json": '
     + _deep_object(100).encode() + b"}"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": '
     + _deep_object(480).encode() + b"}}}"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "tools": [{"type": "function", "function": {"name": "f", "parameters": '
     + _deep_object(480).encode() + b"}}]}"),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "text": {"format": {"type":'
     b' "json_schema", "name": "x", "schema": ' + _deep_object(480).encode() + b"}}}"),
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": 2, "structured_outputs": {"grammar":'
     b' "start: ' + b"(" * 300 + b'\\"a\\"' + b")" * 300 + b'"}}'),
    # auto tools beside a response format (the tools' grammar was dropped).
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "tools": [{"type": "function", "function": {"name": "f"}}], "response_format":'
     b' {"type": "json_object"}}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "logit_bias": {"abc": 1}}'),
    # Found by the deep mode (2026-12-02): integer bounds that both saturate at -2**63 sent
    # llguidance's range-regex builder into unbounded recursion: a stack overflow (SIGSEGV)
    # that killed the validating process, not a 5xx.
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema":'
     b' {"type": "array", "items": {"type": "integer", "minimum": -143765112667930165248,'
     b' "maximum": -143765112667930165248}}}}}'),
    ("/v1/completions", b'{"prompt": "Hi", "max_tokens": 2, "guided_json": {"type": "integer",'
     b' "minimum": -1e19, "maximum": -1e19, "multipleOf": 3}}'),
    ("/v1/responses", b'{"input": "hi", "max_output_tokens": 2, "tool_choice": "auto", "tools":'
     b' [{"type": "function", "name": "now", "parameters": {"type": "array", "items": {"type":'
     b' "integer", "minimum": -1180591620717411303423, "maximum": -1180591620717411303423}}}]}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,'
     b' "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object",'
     b' "properties": {"n": {"type": "integer", "minimum": -1e19, "maximum": -1e19}}}}}]}'),
]  # fmt: skip
"""Every body a fuzz test found a 5xx with (or the issue reported), run on every run."""
