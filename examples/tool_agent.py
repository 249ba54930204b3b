"""A short agent loop with the OpenAI SDK: the model calls a local Python function, gets its
result back, and answers.

    trio-llm serve &          # the default model on http://127.0.0.1:8000
    python examples/tool_agent.py [BASE_URL]

The server prompts the model with the tool, and `tool_choice="required"` on the first turn
makes the call well-formed whatever the model (a grammar built from the tool's schema); the
second turn sends the result back as a `tool` message and lets the model answer in text.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import openai

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 40}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    }
]


def get_weather(city: str) -> dict[str, Any]:
    """The local function the model calls (a stand-in for a real weather service)."""
    return {"city": city, "temperature_c": 21, "sky": "sunny"}


FUNCTIONS = {"get_weather": get_weather}


def run(base_url: str, question: str = "What is the weather like in Paris?") -> str:
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="none")
    model = client.models.list().data[0].id
    messages: list[Any] = [{"role": "user", "content": question}]
    tool_choice = "required"
    for _turn in range(4):
        reply = client.chat.completions.create(
            model=model,
            messages=messages,
            tools=TOOLS,  # type: ignore[arg-type]
            tool_choice=tool_choice,  # type: ignore[arg-type]
            parallel_tool_calls=False,
            max_tokens=120,
            temperature=0,
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            return message.content or ""
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            arguments = json.loads(call.function.arguments)
            result = FUNCTIONS[call.function.name](**arguments)
            print(f"called {call.function.name}({arguments}) -> {result}")
            messages.append(
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}
            )
        tool_choice = "none"  # the result is in: now answer
    raise RuntimeError("the model kept calling tools")


if __name__ == "__main__":
    answer = run(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000")
    print(answer)
