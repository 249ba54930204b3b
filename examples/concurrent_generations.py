"""Several generations at once in a Trio nursery; one is cancelled, the others carry on.

    python examples/concurrent_generations.py [MODEL]

Each question streams in its own task. The last one runs under `trio.move_on_after(2.0)`: when
the deadline passes, the cancellation that reaches `generate()` is what aborts that request in
the engine (there is no separate abort call), and the other streams are unaffected.
"""

from __future__ import annotations

import sys

import trio

import trio_llm

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a haiku about the sea.",
]
CANCELLED = "Tell me a very long story about a lighthouse keeper."


async def ask(client: trio_llm.EngineClient, question: str, deadline: float = float("inf")) -> None:
    prompt = await client.apply_chat_template([{"role": "user", "content": question}])
    params = trio_llm.SamplingParams(
        max_tokens=200, temperature=0.0, output_kind=trio_llm.RequestOutputKind.DELTA
    )
    text, finish_reason = [], None
    with trio.move_on_after(deadline) as scope:
        async for output in client.generate(prompt, params):
            text.append(output.outputs[0].text)
            finish_reason = output.outputs[0].finish_reason
    outcome = f"cancelled after {deadline} s" if scope.cancelled_caught else finish_reason
    print(f"\n## {question}  [{outcome}]\n{''.join(text).strip()}")


async def main(model: str | None) -> None:
    async with trio_llm.open_engine(model) as client, trio.open_nursery() as nursery:
        for question in QUESTIONS:
            nursery.start_soon(ask, client, question)
        nursery.start_soon(ask, client, CANCELLED, 2.0)


if __name__ == "__main__":
    trio.run(main, sys.argv[1] if len(sys.argv) > 1 else None)
