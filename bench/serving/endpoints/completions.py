"""/v1/completions: the prompt as plain text; text in each choice."""

from __future__ import annotations

from typing import Any

PATH = "/v1/completions"


def prompt_fields(prompt: str) -> dict[str, object]:
    return {"prompt": prompt}


def text(choice: dict[str, Any]) -> str | None:
    return choice.get("text")


def prompt_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    return tokenizer(prompt)["input_ids"]
