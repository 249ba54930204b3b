"""Scoring text pairs: which pairs a call means, and how an embedding model scores one.

What it owns: vLLM's pairing rules for `score(text_1, text_2)` (one against one, one against
many, or many against as many, pair i being text_1[i] with text_2[i]) and the cosine by which
an embedding model scores a pair (vLLM's: the embeddings are not assumed normalised). A
cross-encoder scores a pair by its own forward (the engine's classifier head); nothing here
touches the engine. Pure functions, checked before anything is sent.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trio_llm.client.errors import InvalidPromptError


def pair_up(
    text_1: str | Sequence[str],
    text_2: str | Sequence[str],
    names: tuple[str, str] = ("text_1", "text_2"),
) -> tuple[list[str], list[str]]:
    """The pairs to score, as two lists of equal length: 1:1, 1:N (text_1 repeated) or N:N.
    `InvalidPromptError` naming the side (`names`: what the caller calls the two) for an
    empty side, an empty text, or lengths that pair up none of these ways."""
    firsts = [text_1] if isinstance(text_1, str) else list(text_1)
    seconds = [text_2] if isinstance(text_2, str) else list(text_2)
    for param, given, texts in ((names[0], text_1, firsts), (names[1], text_2, seconds)):
        if not texts:
            raise InvalidPromptError(f"{param} must not be empty", param=param)
        for i, text in enumerate(texts):
            where = param if isinstance(given, str) else f"{param}[{i}]"
            if not isinstance(text, str):
                raise InvalidPromptError(f"{where} must be a text", param=where)
            if not text:
                raise InvalidPromptError(f"{where} must not be an empty text", param=where)
    if len(firsts) == 1:
        firsts = firsts * len(seconds)
    elif len(firsts) != len(seconds):
        first, second = names
        raise InvalidPromptError(
            f"{first} has {len(firsts)} texts and {second} {len(seconds)}: score one text "
            f"against one or many (1:1, 1:N), or as many against as many (N:N, pair i is "
            f"{first}[i] with {second}[i])",
            param=second,
        )
    return firsts, seconds


def text_params(param: str, given: str | Sequence[str]) -> list[str]:
    """The request field each text's errors name: `param` for one text, `param[i]` in a
    list."""
    if isinstance(given, str):
        return [param]
    return [f"{param}[{i}]" for i in range(len(given))]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two embeddings (0 for a zero vector), computed in float32 as vLLM's
    `cosine_similarity` of the two is."""
    norms = float(np.linalg.norm(a)) * float(np.linalg.norm(b))
    return float(np.dot(a, b) / max(norms, 1e-12))
