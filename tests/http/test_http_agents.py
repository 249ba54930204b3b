"""The OpenAI Agents SDK against the real server: an agent on the SDK's default model kind
(OpenAIResponsesModel, so /v1/responses) runs to its final output, plainly and streamed, and one
with a function tool calls it (tool_choice required) and finishes, on the tool's output or with
its own answer after it. Skipped where the `openai-agents` package (a test extra) is not
installed."""

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


def weather_agent(cities: list[str], instructions: str, **fields: object) -> object:
    """An agent with one function tool, forced on its first turn (the SDK then resets
    tool_choice to auto); the tool records the cities it is asked about."""

    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        cities.append(city)
        return f"Sunny, 21 C in {city}"

    # One call per turn: after its call the default model's next token is a near tie between
    # the end and a newline that opens a second call, which differs between CPU classes.
    settings = agents.ModelSettings(
        temperature=0, max_tokens=64, tool_choice="required", parallel_tool_calls=False
    )
    return agents.Agent(
        name="Weather",
        instructions=instructions,
        model=DEFAULT_MODEL,
        model_settings=settings,
        tools=[get_weather],
        **fields,
    )


def test_an_agent_calls_a_function_tool_and_finishes(run_config: object) -> None:
    cities: list[str] = []
    agent = weather_agent(cities, "Use the tool to answer.", tool_use_behavior="stop_on_first_tool")
    result = agents.Runner.run_sync(agent, "What is the weather in Paris?", run_config=run_config)
    assert len(cities) == 1 and cities[0]
    assert result.final_output == f"Sunny, 21 C in {cities[0]}"
    kinds = [item.type for item in result.new_items]
    assert kinds == ["tool_call_item", "tool_call_output_item"]


def test_an_agent_answers_after_its_tool(run_config: object) -> None:
    """The whole loop: the call, its output sent back as a function_call_output item, and
    the model's answer after it."""
    cities: list[str] = []
    agent = weather_agent(cities, "Use the tool, then answer in one sentence.")
    result = agents.Runner.run_sync(
        agent, "What is the weather in Paris?", run_config=run_config, max_turns=4
    )
    assert cities and isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"]
    assert kinds[-1] == "message_output_item"
