"""Bad input to the pooling endpoints never gets a 5xx: generated bodies against /pooling,
/classify, /score, /rerank and /invocations, served by stand-in pooling engines (a
cross-encoder and an embedding model) through Quart's in-process test client."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import hypothesis.strategies as st
import numpy as np
import pytest
import trio
from http_fake_engine import FakeEngine
from hypothesis import HealthCheck, given, settings

from fuzz_bodies import json_values
from trio_llm.client.errors import InvalidPromptError, PromptTooLongError
from trio_llm.client.scoring import cosine, pair_up, text_params
from trio_llm.http import ServerConfig, build_app
from trio_llm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
)


class FakePoolingEngine(FakeEngine):
    """Scores and classes from characters (id = ord(char)), with the real client's checks
    that need no tokenizer: the pairing of texts, lengths, the truncation's range."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.model_config.labels = ["no", "yes"]

    def _ids(self, text: str | list[int], param: str, truncate: int | None) -> list[int]:
        ids = [ord(c) % self.vocab_size for c in text] if isinstance(text, str) else list(text)
        if truncate is not None:
            if truncate != -1 and not 1 <= truncate <= self.max_model_len:
                raise InvalidPromptError("bad truncation", param="truncate_prompt_tokens")
            ids = ids[: self.max_model_len if truncate == -1 else truncate]
        if not ids or min(ids) < 0 or max(ids) >= self.vocab_size:
            raise InvalidPromptError(f"{param} is empty or out of the vocabulary", param=param)
        if len(ids) > self.max_model_len:
            raise PromptTooLongError(
                "too long", param=param, prompt_tokens=len(ids), max_tokens=None,
                max_model_len=self.max_model_len,
            )  # fmt: skip
        return ids

    async def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
        names: tuple[str, str] = ("text_1", "text_2"),
        **_: Any,
    ) -> list[ScoringRequestOutput]:
        await trio.lowlevel.checkpoint()
        firsts, seconds = pair_up(text_1, text_2, names)
        out = []
        for first, second, param in zip(firsts, seconds, text_params(names[1], text_2)):
            ids = self._ids(first + second, param, truncate_prompt_tokens)
            a = np.array([len(first), 1.0], np.float32)
            b = np.array([len(second), 1.0], np.float32)
            out.append(ScoringRequestOutput("s", ids, ScoringOutput(cosine(a, b))))
        return out

    async def classify(
        self, prompts: list[str | list[int]], *, truncate_prompt_tokens: int | None = None, **_: Any
    ) -> list[ClassificationRequestOutput]:
        await trio.lowlevel.checkpoint()
        return [
            ClassificationRequestOutput(
                "c",
                self._ids(p, f"input[{i}]", truncate_prompt_tokens),
                ClassificationOutput([0.25, 0.75], "yes"),
            )
            for i, p in enumerate(prompts)
        ]


_APP = build_app(
    FakePoolingEngine(max_model_len=64, task="score", name="fake-ce"),
    FakePoolingEngine(max_model_len=64, task="embed", name="fake-embed"),
    FakeEngine(max_model_len=64, name="fake-model"),
    config=ServerConfig(),
)

BODIES = {
    "/pooling": {"model": "fake-ce", "input": ["hi", "there"]},
    "/classify": {"model": "fake-ce", "input": "hi"},
    "/score": {"model": "fake-ce", "text_1": "q", "text_2": ["a", "b"]},
    "/rerank": {"model": "fake-embed", "query": "q", "documents": ["a", {"text": "b"}]},
    "/v2/rerank": {"model": "fake-ce", "query": "q", "documents": ["a", "b"], "top_n": 1},
    "/invocations": {"model": "fake-ce", "query": "q", "documents": ["a"]},
}
FIELDS = [
    "model", "input", "messages", "encoding_format", "dimensions", "truncate_prompt_tokens",
    "add_special_tokens", "text_1", "text_2", "query", "documents", "top_n",
    "return_documents", "max_tokens_per_doc", "priority", "request_id", "user",
    "chat_template_kwargs",
]  # fmt: skip


async def _post(route: str, raw: bytes) -> tuple[int, bytes]:
    client = _APP.test_client()
    response = await client.post(route, data=raw, headers={"Content-Type": "application/json"})
    return response.status_code, await response.get_data()


def _check(status: int, body: bytes) -> None:
    assert status < 500, body
    if status >= 400:
        assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}


async def test_the_valid_bodies_are_served() -> None:
    for route, body in BODIES.items():
        status, answer = await _post(route, json.dumps(body).encode())
        assert status == 200, (route, answer)


@pytest.mark.parametrize("route", BODIES)
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(changes=st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=4))
async def test_mutated_fields_never_5xx(route: str, changes: dict[str, Any]) -> None:
    _check(*await _post(route, json.dumps({**BODIES[route], **changes}).encode()))


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=64) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_arbitrary_bodies_never_5xx(raw: bytes) -> None:
    for route in BODIES:
        _check(*await _post(route, raw))
