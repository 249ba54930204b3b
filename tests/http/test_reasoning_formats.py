"""The reasoning formats beyond `<think>`: Mistral's `[THINK]`, Granite's sentences and
Harmony's analysis channel (gpt-oss). Their parsers on hand-written output split at every
point, `auto` from a template written the family's way, where the output starts, and the
think-then-answer grammar with the budget forcing each format's closing marker (the default
tokenizer with the families' control tokens added as special tokens)."""

from __future__ import annotations

from typing import Any

import pytest
from llguidance import LLMatcher
from tool_format_templates import SPECIAL_TOKENS, TEMPLATES
from transformers import AutoTokenizer

from trio_llm.constraint import Constraint
from trio_llm.grammar import grammar_text, grammar_vocabulary
from trio_llm.http.answer import AnswerReader
from trio_llm.http.reasoning import ReasoningParser, pick_reasoning_format, plan_reasoning
from trio_llm.http.reasoning.formats import FORMATS, GRANITE, MISTRAL, OPENAI
from trio_llm.http.tools import FunctionTool, plan_tools
from trio_llm.thinking_budget import ThinkingBudget

HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"

# (format, output, reasoning, content)
OUTPUTS = [
    ("mistral", "[THINK]Let me see.[/THINK]The answer.", "Let me see.", "The answer."),
    ("mistral", "No thinking [THINK] here.", None, "No thinking [THINK] here."),
    ("mistral", "[THINK]cut off", "cut off", ""),
    (
        "granite",
        "Here is my thought process:\nIt rains.\n\nHere is my response:\nTake an umbrella.",
        "It rains.",
        "Take an umbrella.",
    ),
    ("granite", "Here is the answer.", None, "Here is the answer."),
    ("granite", "Here's my thought process: Hm.\nHere's my response: Yes.", "Hm.", "Yes."),
    (
        "openai",
        f"<|channel|>analysis<|message|>User asks. Easy.<|end|>{HARMONY_FINAL}Hi there.",
        "User asks. Easy.",
        "Hi there.",
    ),
    ("openai", "<|channel|>final<|message|>Just this.", None, "Just this."),
    ("openai", "<|channel|>analysis<|message|>still", "still", ""),
]


@pytest.mark.parametrize(("format", "output", "reasoning", "content"), OUTPUTS)
def test_each_format_splits_the_same_however_the_output_arrives(
    format: str, output: str, reasoning: str | None, content: str
) -> None:
    cuts = [[output[:i], output[i:]] for i in range(len(output) + 1)] + [list(output)]
    for pieces in cuts:
        parser = ReasoningParser(FORMATS[format])
        streamed = [parser.feed(p) for p in pieces] + [parser.end()]
        thought, answer = parser.finish()
        assert (thought, answer) == (reasoning, content), pieces
        assert "".join(r for r, _ in streamed) == (reasoning or "")
        assert "".join(c for _, c in streamed) == content


def test_harmony_thinking_then_a_call_on_the_commentary_channel() -> None:
    """The reasoning parser drops the channel header; the tool parser reads the call."""
    tools = plan_tools([FunctionTool("now")], "auto", None, [], chat_template=None, parser="openai")
    output = (
        "<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>"
        "commentary to=functions.now <|constrain|>json<|message|>{}"
    )
    for i in range(len(output) + 1):
        reader = AnswerReader(ReasoningParser(OPENAI), tools.new_parser())
        reader.feed(output[:i])
        reader.feed(output[i:])
        thought, content, calls = reader.finish()
        assert (thought, content) == ("Need the time.", "")
        assert [(c.name, c.arguments) for c in calls] == [("now", "{}")]


GRANITE_TEMPLATE = (
    "{%- for m in messages %}<|start_of_role|>{{ m.role }}<|end_of_role|>{{ m.content }}"
    "<|end_of_text|>\n{% endfor %}{%- if thinking %}<|start_of_role|>system<|end_of_role|>"
    "Respond after thinking: write 'Here is my thought process:', your thoughts, then 'Here "
    "is my response:' and the answer.<|end_of_text|>\n{% endif %}"
    "{%- if add_generation_prompt %}<|start_of_role|>assistant<|end_of_role|>{% endif %}"
)
MAGISTRAL_TEMPLATE = (
    "[SYSTEM_PROMPT]First draft your thinking process inside [THINK] and [/THINK], then "
    "answer.[/SYSTEM_PROMPT]{%- for m in messages %}{%- if m.role == 'user' %}[INST]"
    "{{ m.content }}[/INST]{%- else %}{{ m.content }}</s>{%- endif %}{%- endfor %}"
)
HARMONY_TEMPLATE = TEMPLATES["openai"].replace(
    "<|start|>assistant<|channel|>final<|message|>",
    "<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>"
    "<|start|>assistant<|channel|>final<|message|>",
)


def test_auto_picks_each_format_from_its_template() -> None:
    assert pick_reasoning_format("auto", MAGISTRAL_TEMPLATE) is MISTRAL
    assert pick_reasoning_format("auto", GRANITE_TEMPLATE) is GRANITE
    assert pick_reasoning_format("auto", HARMONY_TEMPLATE) is OPENAI
    assert pick_reasoning_format("auto", TEMPLATES["mistral"]) is None  # no [THINK] in it
    assert pick_reasoning_format("gpt_oss", None) is OPENAI


def test_granite_thinks_only_when_asked() -> None:
    assert not plan_reasoning(GRANITE, "<|end_of_role|>", None, None).thinks
    asked = plan_reasoning(GRANITE, "<|end_of_role|>", 8, True)
    assert asked.thinks and asked.constrain(None) is not None
    assert plan_reasoning(MISTRAL, "[/INST]").thinks


@pytest.fixture(scope="module")
def tokenizer(default_model: Any) -> Any:
    tokenizer = AutoTokenizer.from_pretrained(default_model.path)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    return tokenizer


@pytest.fixture(scope="module")
def llg(tokenizer: Any) -> Any:
    return grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id]).tokenizer


SCHEMA = Constraint.json_schema(
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
)


@pytest.mark.parametrize("format", [MISTRAL, GRANITE, OPENAI], ids=lambda f: f.name)
def test_the_budget_forces_each_format_s_closing_marker(
    llg: Any, tokenizer: Any, format: Any
) -> None:
    """The answer's schema after the block; once the budget is spent the engine's count
    forces the closing marker (a control token where the family's is one), then the answer."""
    plan = plan_reasoning(format, "", budget=12, enabled=True)
    constraint = plan.constrain(SCHEMA)
    assert constraint is not None and constraint.thinking is not None
    matcher = LLMatcher(llg, grammar_text(constraint), log_level=0)

    def encode(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    budget = ThinkingBudget.of(
        constraint.thinking, lambda t: llg.decode_bytes([t]), lambda b: encode(b.decode())
    )
    assert budget is not None
    for token in encode(format.open_tag + " word" * 20):
        if budget.next_token() is not None:
            break  # spent: the engine writes the marker now
        assert matcher.consume_token(token), matcher.get_error()
        budget.advance([token])
    forced = []
    while (token := budget.next_token()) is not None:
        assert matcher.consume_token(token), matcher.get_error()
        budget.advance([token])
        forced.append(token)
    assert tokenizer.decode(forced) == format.close_tag and budget.closed
    header = HARMONY_FINAL if format is OPENAI else "\n"
    for token in encode(header + '{"a":1}'):
        assert matcher.consume_token(token), matcher.get_error()
    assert matcher.is_accepting()
