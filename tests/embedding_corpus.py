"""A corpus of sentences of mixed lengths, made from a seed, for the embedding tests and
bench/apis/embed.py: mostly short (a search query, a title), some a paragraph, a few longer than
all-MiniLM-L6-v2's 256 tokens (which sentence-transformers truncates)."""

from __future__ import annotations

import random

_TEXT = (
    "the a of to and in is for on with as by at from that this it an be are was or which "
    "model engine server request token batch memory cache kernel thread process ring shared "
    "python trio quart hypercorn stream latency throughput embedding sentence vector search "
    "query document paragraph river mountain city coffee morning music garden winter summer "
    "quickly slowly carefully never always often running reading writing building measuring "
    "über café naïve 東京 données 😀"
)
_WORDS = _TEXT.split()


def sentences(count: int, *, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        roll = rng.random()
        if roll < 0.6:
            n = rng.randint(2, 16)
        elif roll < 0.92:
            n = rng.randint(17, 120)
        else:
            n = rng.randint(200, 400)
        words = [rng.choice(_WORDS) for _ in range(n)]
        text = " ".join(words)
        out.append(text[0].upper() + text[1:] + ("?" if i % 7 == 0 else "."))
    return out
