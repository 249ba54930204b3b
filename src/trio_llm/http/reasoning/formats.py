"""The reasoning formats a model's thinking may come in, chosen by `--reasoning-parser` (or per
model: `MODEL:reasoning=FORMAT`).

What it owns: each format's tags (one small record per format), whether its output starts
inside the think block when the prompt does not say, and which format `auto` picks from a chat
template's text. The parser, the grammar and the planning read these records, so a format
whose thinking is a block between two markers (`<think>`, Mistral's `[THINK]`, Granite's
sentences, Harmony's analysis channel) is one entry in `FORMATS`.
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
    answer_heads: tuple[str, ...] = ()
    """Control text the answer may start with, which is neither answer nor thinking
    (Harmony's `<|start|>assistant<|channel|>final<|message|>`): dropped; the grammar allows
    it (`header`) after the block."""
    header: str = ""
    """What a constrained answer may start with after the block (Harmony's final channel)."""
    variants: tuple[tuple[str, str], ...] = ()
    """Other spellings of the tags the parser reads (Granite's "Here's ..."); the grammar and
    the budget write the main ones."""
    opt_in: bool = False
    """The model thinks only when the request turns thinking on (Granite's `thinking`): the
    grammar opens no block otherwise."""

    @property
    def open_tags(self) -> tuple[str, ...]:
        """Every spelling of the open tag the parser reads, the main one first."""
        return (self.open_tag, *(v[0] for v in self.variants))

    @property
    def close_tags(self) -> tuple[str, ...]:
        return (self.close_tag, *(v[1] for v in self.variants))


DEEPSEEK_R1 = ReasoningFormat("deepseek_r1", starts_inside=True)
"""DeepSeek-R1 and its distills: the template opens the block (`<think>\\n`), the output
thinks, writes `</think>` and answers."""

QWEN3 = ReasoningFormat("qwen3")
"""Qwen3 (and most hybrid models since): the output opens `<think>` itself; with
`enable_thinking` false the template writes an empty block into the prompt."""

MISTRAL = ReasoningFormat("mistral", "[THINK]", "[/THINK]", keeps_special=True)
"""Magistral: `[THINK]...[/THINK]` then the answer; the tags are control tokens."""

GRANITE = ReasoningFormat(
    "granite",
    "Here is my thought process:",
    "Here is my response:",
    variants=(("Here's my thought process:", "Here's my response:"),),
    opt_in=True,
)
"""IBM Granite 3.2/3.3 with `thinking=True`: plain sentences open and close the thinking."""

OPENAI = ReasoningFormat(
    "openai",
    "<|channel|>analysis<|message|>",
    "<|end|>",
    keeps_special=True,
    answer_heads=("<|start|>assistant", "<|channel|>final<|message|>"),
    header="<|start|>assistant<|channel|>final<|message|>",
)
"""gpt-oss's Harmony: the analysis channel is the thinking, then the final channel (or a call
on the commentary channel, which the tool parser reads) is the answer."""

FORMATS: dict[str, ReasoningFormat] = {
    f.name: f for f in (DEEPSEEK_R1, QWEN3, MISTRAL, GRANITE, OPENAI)
}
ALIASES: dict[str, ReasoningFormat] = {"gpt_oss": OPENAI, "openai_gptoss": OPENAI}
"""vLLM's other names for a format."""
PARSER_NAMES: tuple[str, ...] = ("auto", "none", *FORMATS, *ALIASES)
"""The values of `--reasoning-parser` (and of a model's `reasoning=` option)."""


def pick_reasoning_format(name: str, chat_template: str | None) -> ReasoningFormat | None:
    """The format `name` means (None: thinking is not split out); `auto`: the one the chat
    template shows, when it writes both tags (Harmony's channels, Mistral's `[THINK]`,
    Granite's sentences; for `<think>`, DeepSeek-R1's by its role markers, Qwen3's
    otherwise), else none."""
    if name == "none":
        return None
    if name != "auto":
        return FORMATS.get(name) or ALIASES[name]
    template = chat_template or ""
    if "<|channel|>" in template and "analysis" in template:
        return OPENAI
    if MISTRAL.open_tag in template and MISTRAL.close_tag in template:
        return MISTRAL
    if GRANITE.open_tag in template and GRANITE.close_tag in template:
        return GRANITE
    if QWEN3.open_tag not in template or QWEN3.close_tag not in template:
        return None
    if "<｜Assistant｜>" in template:
        return DEEPSEEK_R1
    return QWEN3
