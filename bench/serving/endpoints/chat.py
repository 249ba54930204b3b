"""/v1/chat/completions: the prompt as one user message; text in each choice's delta."""

from __future__ import annotations

from typing import Any

PATH = "/v1/chat/completions"


def prompt_fields(prompt: str) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": prompt}]}


def text(choice: dict[str, Any]) -> str | None:
    return choice.get("delta", {}).get("content")


def prompt_token_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Through the model's chat template, with the assistant turn opened, as a server does."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )["input_ids"]
