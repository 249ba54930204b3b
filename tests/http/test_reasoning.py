"""Reasoning without a model: the streaming parser on outputs of both styles (split at every
character), the template switches, where the output starts, the answer reader that puts the
reasoning parser before the tool parser, and the think-then-constrain grammar against
llguidance with the default model's tokenizer (free thinking up to the closing tag, the
constraint after it, the budget forcing the tag)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask
from transformers import AutoTokenizer

from trio_llm.constraint import Constraint, Thinking
from trio_llm.grammar import ConstraintError, check, grammar_text, grammar_vocabulary
from trio_llm.http.answer import AnswerReader
from trio_llm.http.reasoning import (
    ReasoningParser,
    effort_enables,
    pick_reasoning_format,
    plan_reasoning,
    template_switches,
    thinking_kwargs,
)
from trio_llm.http.reasoning.formats import DEEPSEEK_R1, QWEN3
from trio_llm.http.tools import ToolCallParser
from trio_llm.http.tools.formats import HERMES
from trio_llm.http.tools.grammar import tool_grammar
from trio_llm.http.tools.prompting import FunctionTool
from trio_llm.thinking_budget import ThinkingBudget

# (inside, output, reasoning, content)
OUTPUTS = [
    (False, "<think>\nLet me see.\n</think>\n\nThe answer.", "Let me see.", "The answer."),
    (False, "Just an answer <think>x</think> ", None, "Just an answer <think>x</think> "),
    (False, "  <think>a < b, so</think>b", "a < b, so", "b"),
    (False, "<think></think>\n\nanswer", None, "answer"),
    (False, "<think>a</think>b</think>c", "a", "b</think>c"),
    (False, "<think>a </think b</think>c", "a </think b", "c"),
    (False, "<thi", None, "<thi"),
    (False, "", None, ""),
    (False, "\n<b>bold</b>", None, "\n<b>bold</b>"),
    (True, 'Let me see.</think>\n\n{"a": 1}', "Let me see.", '{"a": 1}'),
    (True, "<think>\nhm</think>ok", "hm", "ok"),
    (True, "still thinking </thi", "still thinking </thi", ""),
    (True, "  \n </think>  ", None, ""),
    (True, "é≈ 🙂 thought\n\n\n</think>\n🙂 answer\n", "é≈ 🙂 thought", "🙂 answer\n"),
]


def splits(text: str) -> list[list[str]]:
    """Every way to cut the text in two, and one character at a time."""
    return [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]


@pytest.mark.parametrize(("inside", "output", "reasoning", "content"), OUTPUTS)
def test_the_parser_splits_the_same_however_the_output_arrives(
    inside: bool, output: str, reasoning: str | None, content: str
) -> None:
    for pieces in splits(output):
        parser = ReasoningParser(QWEN3, inside=inside)
        fed = [parser.feed(p) for p in pieces] + [parser.end()]
        streamed = "".join(r for r, _ in fed), "".join(c for _, c in fed)
        assert parser.finish() == (reasoning, content), pieces
        assert streamed == (reasoning or "", content), pieces


def test_a_possible_tag_is_held_back_until_it_is_known() -> None:
    parser = ReasoningParser(QWEN3)
    assert parser.feed("<th") == ("", "")
    assert parser.thinking is False
    assert parser.feed("ink>Hmm, ") == ("Hmm,", "")  # the blank may be the thinking's end
    assert parser.thinking is True
    assert parser.feed("yes </") == (" yes", "")
    assert parser.feed("b>") == (" </b>", "")
    assert parser.feed("</think>\n") == ("", "")
    assert parser.feed("\nDone") == ("", "Done")
    assert parser.thinking is False


def test_deepseek_r1_thinks_from_the_start_and_drops_an_open_tag_it_writes_anyway() -> None:
    parser = ReasoningParser(DEEPSEEK_R1, inside=True)
    parser.feed("<think>\nFirst")
    parser.feed("</think>Then")
    assert parser.finish() == ("First", "Then")


def test_auto_picks_the_format_the_template_writes() -> None:
    qwen3 = "{%- if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>"
    r1 = "{{'<｜Assistant｜>'}}<think>\n{% if '</think>' in content %}"
    assert pick_reasoning_format("auto", qwen3) is QWEN3
    assert pick_reasoning_format("auto", r1) is DEEPSEEK_R1
    assert pick_reasoning_format("auto", "{{ messages }}") is None
    assert pick_reasoning_format("auto", None) is None
    assert pick_reasoning_format("none", qwen3) is None
    assert pick_reasoning_format("deepseek_r1", None) is DEEPSEEK_R1


def test_switches_are_set_only_where_the_template_reads_them() -> None:
    qwen3 = "{% if enable_thinking is false %}<think>\n\n</think>{% endif %}"
    effort = "{{ reasoning_effort | default('medium') }}"
    assert template_switches(qwen3) == {"enable_thinking"}
    assert thinking_kwargs(qwen3, enabled=False) == {"enable_thinking": False}
    assert thinking_kwargs(qwen3, enabled=None) == {}
    assert thinking_kwargs(effort, enabled=True, effort="low") == {"reasoning_effort": "low"}
    assert thinking_kwargs("plain {{ messages }}", enabled=False, effort="none") == {}
    assert (effort_enables("none"), effort_enables("low"), effort_enables(None)) == (
        False,
        True,
        None,
    )


def test_the_prompt_says_where_the_output_starts() -> None:
    opened = plan_reasoning(QWEN3, "<|im_start|>assistant\n<think>\n")
    closed = plan_reasoning(QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n", budget=8)
    plain = plan_reasoning(QWEN3, "<|im_start|>assistant\n")
    r1 = plan_reasoning(DEEPSEEK_R1, "<｜Assistant｜>")
    assert (opened.inside, opened.thinks) == (True, True)
    assert (closed.inside, closed.thinks) == (False, False)
    assert (plain.inside, plain.thinks) == (False, True)
    assert (r1.inside, r1.thinks) == (True, True)
    assert plan_reasoning(None, "<think>").new_parser() is None
    # Thinking turned off: the constraint applies from the start, a budget is moot.
    schema = Constraint.json_schema({"type": "object"})
    assert closed.constrain(schema) == schema and closed.constrain(None) is None
    assert plain.constrain(None) is None  # nothing to enforce
    assert plain.constrain(schema) == schema.after_thinking(Thinking())
    budget = plan_reasoning(QWEN3, "<think>", budget=5).constrain(None)
    assert budget is not None and budget.thinking == Thinking(inside=True, budget=5)


def test_the_tool_parser_reads_only_the_answer() -> None:
    call = '<tool_call>[{"name": "f", "arguments": {}}]</tool_call>'
    output = f"<think>Maybe {call}? No.</think>\nOK. {call}"
    for pieces in splits(output):
        reader = AnswerReader(ReasoningParser(QWEN3), ToolCallParser(HERMES))
        fed = [reader.feed(p) for p in pieces] + [reader.end()]
        reasoning, content, calls = reader.finish()
        assert reasoning == f"Maybe {call}? No." == "".join(p.reasoning for p in fed)
        assert content == "OK. " == "".join(p.content for p in fed)
        assert [c.name for c in calls] == ["f"] == [d.name for p in fed for d in p.calls if d.name]


def test_without_parsers_the_text_passes_through() -> None:
    reader = AnswerReader()
    assert reader.feed("<think>a</think>").content == "<think>a</think>"
    assert reader.finish() == (None, "<think>a</think>", [])


# -- the grammar ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(default_model: Any) -> Any:
    return AutoTokenizer.from_pretrained(default_model.path)


@pytest.fixture(scope="module")
def llg(tokenizer: Any) -> Any:
    return grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id]).tokenizer


def consume(llg: Any, tokenizer: Any, constraint: Constraint, text: str) -> LLMatcher:
    """A matcher for `constraint` that has taken `text`'s tokens (asserting each is allowed)."""
    check(constraint)
    matcher = LLMatcher(llg, grammar_text(constraint), log_level=0)
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.consume_token(token), (text, matcher.get_error())
    return matcher


def rejects(llg: Any, tokenizer: Any, constraint: Constraint, text: str) -> bool:
    matcher = LLMatcher(llg, grammar_text(constraint), log_level=0)
    ok = True
    for token in tokenizer.encode(text, add_special_tokens=False):
        ok = ok and matcher.consume_token(token)
    return not (ok and matcher.is_accepting())


SCHEMA = Constraint.json_schema(
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
)


def test_a_schema_applies_after_the_thinking(llg: Any, tokenizer: Any) -> None:
    opens = SCHEMA.after_thinking(Thinking())
    inside = SCHEMA.after_thinking(Thinking(inside=True))
    thought = 'I could write {"a": "x"} here, or anything </b> at all.'
    m = consume(llg, tokenizer, opens, f'<think>{thought}</think>\n\n{{"a":1}}')
    assert m.is_stopped()
    assert consume(llg, tokenizer, inside, f'{thought}</think>{{"a":2}}').is_stopped()
    assert rejects(llg, tokenizer, opens, '{"a":1}')  # a thinking model thinks first
    assert rejects(llg, tokenizer, inside, 'thought</think>\n\n{"a":"x"}')
    assert rejects(llg, tokenizer, inside, "thought</think>\n\nnot JSON")
    assert rejects(llg, tokenizer, inside, 'thought</think>\n\n\n\n\n\n{"a":1}')


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        (Constraint.regex("yes|no"), "no"),
        (Constraint.choice(["red", "green"]), "green"),
        (Constraint.grammar('root ::= "x"+'), "xxx"),
        (Constraint.grammar('start: "y"+'), "yy"),
        (Constraint.json_object(), '{"k":[1]}'),
        (Constraint.any_text(), "Anything, at all."),
    ],
)
def test_every_kind_of_constraint_follows_a_think_block(
    llg: Any, tokenizer: Any, answer: Constraint, text: str
) -> None:
    constraint = answer.after_thinking(Thinking(inside=True))
    assert consume(llg, tokenizer, constraint, f"Hmm.</think>{text}").is_accepting()


def test_a_tool_grammar_follows_a_think_block(llg: Any, tokenizer: Any) -> None:
    tool = FunctionTool("f", None, {"type": "object", "properties": {"x": {"type": "integer"}}})
    calls = Constraint.grammar(tool_grammar(HERMES, [tool], forced=False, parallel=True))
    constraint = calls.after_thinking(Thinking())
    call = '<tool_call>[\n{"name":"f","arguments":{"x":1}}\n]</tool_call>'
    consume(llg, tokenizer, constraint, f"<think>Call f? {call[:20]}</think>\nSure. {call}")
    assert rejects(llg, tokenizer, constraint, '<think></think><tool_call>[{"name":"g"')


def budget_of(tokenizer: Any, llg: Any, budget: int) -> ThinkingBudget:
    def tokenize(text: bytes) -> list[int]:
        return list(tokenizer.encode(text.decode(), add_special_tokens=False))

    made = ThinkingBudget.of(
        Thinking(inside=True, budget=budget), lambda t: llg.decode_bytes([t]), tokenize
    )
    assert made is not None
    return made


def test_the_budget_forces_the_closing_tag(llg: Any, tokenizer: Any) -> None:
    """The engine's count: once the block has taken its budget with the tag not written, the
    tag's tokens are forced one a step, and the grammar takes them; a tag the model had begun
    is finished, not written again; a tag written within the budget ends the count."""
    constraint = Constraint.any_text().after_thinking(Thinking(inside=True, budget=4))
    matcher = consume(llg, tokenizer, constraint, "")
    budget = budget_of(tokenizer, llg, 4)
    for token in tokenizer.encode("one two three four", add_special_tokens=False):
        assert budget.next_token() is None
        assert matcher.consume_token(token)
        budget.advance([token])
    forced = []
    while (token := budget.next_token()) is not None:
        assert matcher.consume_token(token), matcher.get_error()
        budget.advance([token])
        forced.append(token)
    assert tokenizer.decode(forced) == "</think>" and budget.closed
    for token in tokenizer.encode("\n\nAn answer as long as it likes.", add_special_tokens=False):
        assert budget.next_token() is None and matcher.consume_token(token)
        budget.advance([token])
    # A tag begun at the budget's end is finished.
    begun = budget_of(tokenizer, llg, 3)
    begun.advance(tokenizer.encode("one two</", add_special_tokens=False))
    assert tokenizer.decode(begun.forcing) == "think>"
    # Within the budget, the model's own tag ends the count.
    early = budget_of(tokenizer, llg, 50)
    early.advance(tokenizer.encode("one</think>" + " more" * 60, add_special_tokens=False))
    assert early.closed and early.next_token() is None


def test_empty_tags_and_budgets_are_refused() -> None:
    with pytest.raises(ConstraintError):
        check(SCHEMA.after_thinking(Thinking(close="")))
    with pytest.raises(ConstraintError):
        check(SCHEMA.after_thinking(Thinking(budget=0)))
    with pytest.raises(ConstraintError, match="think block"):
        grammar_text(SCHEMA.after_thinking(Thinking(open="")))
    assert json.loads(grammar_text(SCHEMA.after_thinking(Thinking())))["grammars"][1]["name"]


def test_the_grammar_takes_drafts_and_masks_at_every_step(llg: Any, tokenizer: Any) -> None:
    """As the engine drives it: a mask filled before every token, and jump-forward's drafts
    (consumed, then taken back) at every point; the budget does not change the grammar."""
    free = SCHEMA.after_thinking(Thinking())
    assert grammar_text(free) == grammar_text(SCHEMA.after_thinking(Thinking(budget=50)))
    ids = tokenizer.encode('<think>hmm a </b> b</think>\n\n{"a":12}', add_special_tokens=False)
    matcher = LLMatcher(llg, grammar_text(free), log_level=0)
    mask = allocate_token_bitmask(1, llg.vocab_size)
    for i, token in enumerate(ids):
        fill_next_token_bitmask(matcher, mask, 0)
        ahead = ids[i : i + 3]
        assert matcher.consume_tokens(ahead)
        matcher.rollback(len(ahead))
        assert not matcher.is_error(), matcher.get_error()
        assert matcher.consume_token(token)
    assert matcher.is_stopped()


def test_a_tag_that_is_one_added_token_satisfies_the_grammar(default_model: Any) -> None:
    """Qwen3 and DeepSeek-R1 write `<think>` and `</think>` as single added tokens (not
    special): the grammar's text tags accept them."""
    tokenizer = AutoTokenizer.from_pretrained(default_model.path)
    tokenizer.add_tokens(["<think>", "</think>"])
    llg = grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id]).tokenizer
    think, close = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    matcher = LLMatcher(llg, grammar_text(SCHEMA.after_thinking(Thinking())), log_level=0)
    ids = [think, *tokenizer.encode("Hmm.", add_special_tokens=False), close]
    ids += tokenizer.encode('\n\n{"a":3}', add_special_tokens=False)
    mask = allocate_token_bitmask(1, llg.vocab_size)
    for token in ids:
        fill_next_token_bitmask(matcher, mask, 0)
        assert matcher.consume_token(token), matcher.get_error()
    assert matcher.is_stopped()
    # Special tokens stay special: no text matches them.
    assert llg.is_special_token(tokenizer.eos_token_id) and not llg.is_special_token(close)
