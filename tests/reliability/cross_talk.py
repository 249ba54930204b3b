"""Cross-talk check shared by the fp32 and bf16 server tests: many different seeded requests at
once must each get what they get alone, so no request's tokens, sampler state or KV blocks
leak into another's."""

from __future__ import annotations

import httpx
import trio

WORDS = [
    "river", "mountain", "city", "garden", "music", "story", "letter", "window", "table",
    "paper", "water", "light", "sound", "color", "history", "science", "market", "person",
    "year", "world", "life", "hand", "child", "place", "work", "week", "point", "number",
]  # fmt: skip


def prompts(count: int) -> list[str]:
    """Different prompts of different lengths (3 to 40 words), so the batch mixes prefill
    chunks of several sizes with decodes."""
    return [
        " ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(3 + (i * 5) % 38))
        for i in range(count)
    ]


def completion_body(prompt: str, index: int, **fields: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "prompt": prompt,
        "seed": 1000 + index,
        "max_tokens": 8,
        "ignore_eos": True,
        **fields,
    }


async def alone_and_together(
    client: httpx.AsyncClient, bodies: list[dict[str, object]]
) -> tuple[list[dict], list[dict]]:
    """Each body's completion choice run alone (one at a time), then all at once."""
    alone = []
    for body in bodies:
        response = await client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        alone.append(response.json()["choices"][0])

    together: list[dict] = [{} for _ in bodies]

    async def run(i: int) -> None:
        response = await client.post("/v1/completions", json=bodies[i])
        assert response.status_code == 200, response.text
        together[i] = response.json()["choices"][0]

    async with trio.open_nursery() as nursery:
        for i in range(len(bodies)):
            nursery.start_soon(run, i)
    return alone, together
