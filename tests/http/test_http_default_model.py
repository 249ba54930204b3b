"""The real default model behind the real server: real text through the OpenAI SDK."""

from __future__ import annotations

import openai
import pytest

from trio_llm.config import DEFAULT_MODEL

CAPITAL_QUESTION = "What is the capital of France? Answer in one sentence."


@pytest.mark.slow
def test_default_model_answers_over_the_sdk(default_sdk: openai.OpenAI) -> None:
    sdk = default_sdk
    [model] = sdk.models.list()
    assert model.id == DEFAULT_MODEL
    reply = sdk.chat.completions.create(
        model=DEFAULT_MODEL,
        # Not the bare question: its first token is a near tie (tests/client/test_default_model.py).
        messages=[{"role": "user", "content": CAPITAL_QUESTION}],
        max_tokens=24,
        temperature=0,
    )
    assert "Paris" in (reply.choices[0].message.content or "")
    stream = sdk.completions.create(
        model=DEFAULT_MODEL,
        prompt="The capital of France is",
        max_tokens=4,
        temperature=0,
        stream=True,
    )
    assert "Paris" in "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
