"""Reasoning: splitting a model's thinking from its answer, and constraining only the answer.

The interface, shared by /v1/chat/completions, the Responses API and the Messages API (nothing
here reads a request body or touches Quart):

    format = pick_reasoning_format("auto", chat_template)    # --reasoning-parser; None: off
    kwargs = thinking_kwargs(chat_template, enabled=..., effort=...)   # -> apply_chat_template
    plan = plan_reasoning(format, prompt_tail, budget)       # after rendering
    constraint = plan.constrain(constraint)                  # the answer's, after the thinking
    parser = plan.new_parser()                               # one per choice
    reasoning_delta, content_delta = parser.feed(delta_text) # while streaming
    reasoning_delta, content_delta = parser.end()            # at the output's end
    reasoning, content = parser.finish()                     # the whole of both

Modules: formats (the `<think>` family, Mistral's `[THINK]`, Granite's, Harmony's analysis
channel; `auto` from the template), parser (the streaming parser), planning (template
switches, where the output starts, the constraint).
"""

from trio_llm.http.reasoning.formats import (
    FORMATS,
    PARSER_NAMES,
    ReasoningFormat,
    pick_reasoning_format,
)
from trio_llm.http.reasoning.parser import ReasoningParser
from trio_llm.http.reasoning.planning import (
    PROMPT_TAIL_TOKENS,
    ReasoningPlan,
    effort_enables,
    plan_reasoning,
    template_switches,
    thinking_kwargs,
)

__all__ = [
    "FORMATS",
    "PARSER_NAMES",
    "PROMPT_TAIL_TOKENS",
    "ReasoningFormat",
    "ReasoningParser",
    "ReasoningPlan",
    "effort_enables",
    "pick_reasoning_format",
    "plan_reasoning",
    "template_switches",
    "thinking_kwargs",
]
