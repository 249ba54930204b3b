"""The OpenAI Agents SDK against the real server: an agent on the SDK's default model kind
(OpenAIResponsesModel, so /v1/responses) runs to its final output, plainly and streamed. Skipped
where the `openai-agents` package (a test extra) is not installed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import openai
import pytest

from http_server_process import ServerProcess
from trio_llm.config import DEFAULT_MODEL

agents = pytest.importorskip("agents")

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France? Answer in one word."


@pytest.fixture
def run_config(default_server: ServerProcess) -> Iterator[object]:
    client = openai.AsyncOpenAI(base_url=default_server.url + "/v1", api_key="none", max_retries=0)
    provider = agents.OpenAIProvider(openai_client=client, use_responses=True)
    yield agents.RunConfig(model_provider=provider, tracing_disabled=True)


def agent(**fields: object) -> object:
    settings = agents.ModelSettings(temperature=0, max_tokens=48)
    return agents.Agent(name="Assistant", model=DEFAULT_MODEL, model_settings=settings, **fields)


def test_an_agent_answers(run_config: object) -> None:
    result = agents.Runner.run_sync(agent(), QUESTION, run_config=run_config)
    assert "Paris" in result.final_output
    [response] = result.raw_responses
    assert response.response_id.startswith("resp_")


def test_an_agent_answers_streamed(run_config: object) -> None:
    async def run() -> tuple[str, list[str]]:
        result = agents.Runner.run_streamed(agent(), QUESTION, run_config=run_config)
        kinds = [event.type async for event in result.stream_events()]
        return result.final_output, kinds

    final, kinds = asyncio.run(run())
    assert "Paris" in final
    assert "raw_response_event" in kinds
