"""The reasoning formats a model's thinking may come in, chosen by `--reasoning-parser`.

What it owns: each format's tags (one small record per format), whether its output starts
inside the think block when the prompt does not say, and which format `auto` picks from a chat
template's text. The parser, the grammar and the planning read these records, so a new format
of the `<think>` family is one entry in `FORMATS`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReasoningFormat:
    name: str
    open_tag: str = "<think>"
    close_tag: str = "</think>"
    starts_inside: bool = False
    """Whether the output is thinking until the closing tag even when the prompt does not end
    with the open tag (DeepSeek-R1's distills often leave it out)."""
    keeps_special: bool = False
    """Its tags are special tokens: the output is decoded with them kept."""


DEEPSEEK_R1 = ReasoningFormat("deepseek_r1", starts_inside=True)
"""DeepSeek-R1 and its distills: the template opens the block (`<think>\\n`), the output
thinks, writes `</think>` and answers."""

QWEN3 = ReasoningFormat("qwen3")
"""Qwen3 (and most hybrid models since): the output opens `<think>` itself; with
`enable_thinking` false the template writes an empty block into the prompt."""

FORMATS: dict[str, ReasoningFormat] = {f.name: f for f in (DEEPSEEK_R1, QWEN3)}
PARSER_NAMES: tuple[str, ...] = ("auto", "none", *FORMATS)
"""The values of `--reasoning-parser`."""


def pick_reasoning_format(name: str, chat_template: str | None) -> ReasoningFormat | None:
    """The format `name` means (None: thinking is not split out); `auto`: the one the chat
    template shows, when it writes both tags (DeepSeek-R1's by its role markers, Qwen3's
    otherwise), else none."""
    if name == "none":
        return None
    if name != "auto":
        return FORMATS[name]
    template = chat_template or ""
    if QWEN3.open_tag not in template or QWEN3.close_tag not in template:
        return None
    if "<｜Assistant｜>" in template:
        return DEEPSEEK_R1
    return QWEN3
