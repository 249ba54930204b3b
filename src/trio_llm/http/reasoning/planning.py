"""What a request's thinking takes: the template's switches, where the output starts, the
grammar that keeps a constraint out of the thinking, and the parser that splits it out.

Two steps, around the rendering of the prompt (the only thing that says whether the template
opened or closed the think block):

    kwargs = thinking_kwargs(chat_template, enabled=True, effort=None)  # -> apply_chat_template
    plan = plan_reasoning(format, prompt_tail, budget=1024)             # the rendered prompt's end
    constraint = plan.constrain(constraint)  # thinking first, then the answer's constraint
    parser = plan.new_parser()               # one per choice; None: nothing to split

Invariant: a thinking model's thinking is never turned off by a constraint (the constraint
applies after the block), and a request that turns thinking off gets no thinking grammar.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import jinja2
import jinja2.meta

from trio_llm.constraint import Constraint, Thinking
from trio_llm.http.reasoning.formats import ReasoningFormat
from trio_llm.http.reasoning.parser import ReasoningParser

_SWITCHES = ("enable_thinking", "thinking", "reasoning_effort")
"""The variables templates read to turn thinking on or off (Qwen3, DeepSeek-V3.1) or to set
its effort (gpt-oss)."""


@functools.lru_cache(maxsize=16)
def template_switches(chat_template: str | None) -> frozenset[str]:
    """Which of the thinking switches the template reads (parsed, not searched)."""
    if not chat_template:
        return frozenset()
    try:
        ast = jinja2.Environment().parse(chat_template)
    except jinja2.TemplateSyntaxError:
        return frozenset()
    return frozenset(jinja2.meta.find_undeclared_variables(ast)) & frozenset(_SWITCHES)


def effort_enables(effort: str | None) -> bool | None:
    """What OpenAI's `reasoning_effort` says of thinking: `none` turns it off, any other level
    on; None: nothing."""
    return None if effort is None else effort != "none"


def thinking_kwargs(
    chat_template: str | None, *, enabled: bool | None, effort: str | None = None
) -> dict[str, Any]:
    """The template arguments that turn thinking on or off (`enabled`; None: the template's
    default) and set its effort, for the switches this template reads; nothing for one that
    has none (its model thinks as it always does)."""
    switches = template_switches(chat_template)
    out: dict[str, Any] = {}
    if enabled is not None:
        for name in ("enable_thinking", "thinking"):
            if name in switches:
                out[name] = enabled
    if effort is not None and "reasoning_effort" in switches:
        out["reasoning_effort"] = effort
    return out


PROMPT_TAIL_TOKENS = 16
"""How many of the prompt's last tokens `plan_reasoning` reads (the end of the template's
generation prompt)."""


@dataclass(frozen=True, slots=True)
class ReasoningPlan:
    format: ReasoningFormat | None
    """None: thinking is not split out (no parser for this model)."""
    inside: bool = False
    """The output starts inside the think block."""
    thinks: bool = False
    """Whether the output will hold a think block (False when the template closed an empty
    one into the prompt, which is how `enable_thinking: false` turns it off)."""
    budget: int | None = None

    def new_parser(self) -> ReasoningParser | None:
        """A parser for one choice's output; None when thinking is not split out."""
        if self.format is None:
            return None
        return ReasoningParser(self.format, inside=self.inside)

    def constrain(self, constraint: Constraint | None) -> Constraint | None:
        """The constraint of the whole output: `constraint` on the answer after the think block
        (within the budget); a budget alone constrains only the block. Unchanged when the
        output will not think."""
        if self.format is None or not self.thinks:
            return constraint
        if constraint is None:
            if self.budget is None:
                return None
            constraint = Constraint.any_text()
        thinking = Thinking(
            open=self.format.open_tag,
            close=self.format.close_tag,
            inside=self.inside,
            budget=self.budget,
            header=self.format.header,
        )
        return constraint.after_thinking(thinking)


def plan_reasoning(
    format: ReasoningFormat | None,
    prompt_tail: str,
    budget: int | None = None,
    enabled: bool | None = None,
) -> ReasoningPlan:
    """Where the output starts, from the end of the rendered prompt (`prompt_tail`: the text of
    its last `PROMPT_TAIL_TOKENS` tokens, special tokens included): a prompt that ends with the
    open tag opened the block, one that ends with the closing tag turned thinking off;
    otherwise the format says (an opt-in format thinks only when `enabled`)."""
    if format is None:
        return ReasoningPlan(None)
    tail = prompt_tail.rstrip()
    if tail.endswith(format.close_tag) or (format.opt_in and not enabled):
        return ReasoningPlan(format, inside=False, thinks=False, budget=budget)
    inside = tail.endswith(format.open_tag) or format.starts_inside
    return ReasoningPlan(format, inside=inside, thinks=True, budget=budget)
