"""Bad input never gets a 5xx: generated bodies against every POST route (fake engine,
Quart's in-process test client, so hundreds of requests take a second or two)."""

from __future__ import annotations

import json
from typing import Any

import hypothesis.strategies as st
import pytest
from http_fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings

from trio_llm.http import ServerConfig, build_app

ROUTES = {
    "/v1/chat/completions": {
        "model": "fake-model",
        "messages": [{"role": "user", "content": "hi"}],
    },
    "/v1/completions": {"model": "fake-model", "prompt": "hi"},
    "/tokenize": {"prompt": "hi"},
    "/detokenize": {"tokens": [104]},
}
FIELDS = [
    "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature",
    "top_p", "n", "stream", "stream_options", "stop", "seed", "presence_penalty",
    "frequency_penalty", "logit_bias", "logprobs", "top_logprobs", "echo", "user",
    "response_format", "tools", "tool_choice", "top_k", "min_p", "repetition_penalty",
    "min_tokens", "ignore_eos", "stop_token_ids", "skip_special_tokens",
    "include_stop_str_in_output", "add_generation_prompt", "continue_final_message",
    "chat_template_kwargs", "priority", "request_id", "tokens", "suffix", "best_of",
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


_APP = build_app(FakeEngine(max_model_len=64), config=ServerConfig())


def _client() -> Any:
    return _APP.test_client()


@pytest.mark.parametrize("route", ROUTES)
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4))
async def test_mutated_fields_never_5xx(route: str, changes: dict[str, Any]) -> None:
    body = {**ROUTES[route], **changes, "max_tokens": changes.get("max_tokens", 2)}
    if body.get("stream") is True:
        body["stream"] = False  # a 200 stream is fine; its status is what matters here
    response = await _client().post(route, json=body)
    assert response.status_code < 500, (body, await response.get_data())
    if response.status_code >= 400:
        error = (await response.get_json())["error"]
        assert set(error) == {"message", "type", "param", "code"}


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_arbitrary_bodies_never_5xx(raw: bytes) -> None:
    client = _client()
    for route in ROUTES:
        response = await client.post(route, data=raw, headers={"Content-Type": "application/json"})
        assert response.status_code < 500, (route, raw, await response.get_data())
