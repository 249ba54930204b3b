"""What splitting out and constraining a model's thinking costs, measured without a model.

1. The streaming parsers (http/answer.py's AnswerReader: the reasoning parser, then the tool
   parser) fed a long output one token-sized piece at a time, against the text passing through
   unread: microseconds per piece.
2. The grammar side of the think-then-constrain path on the default model's vocabulary: the
   time to fill one token mask (and take the token) at each step of an output that thinks
   through about 300 tokens and then writes a JSON object, against the same JSON without the
   think block (a budget changes nothing here: the engine counts it, not the grammar).

    python bench/apis/reasoning.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from llguidance import LLMatcher
from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

from trio_llm.constraint import Constraint, Thinking
from trio_llm.grammar import grammar_text, grammar_vocabulary
from trio_llm.http.answer import AnswerReader
from trio_llm.http.reasoning import ReasoningParser
from trio_llm.http.reasoning.formats import QWEN3
from trio_llm.http.tools import ToolCallParser
from trio_llm.http.tools.formats import HERMES
from trio_llm.model_files import load_tokenizer, resolve_model

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

ANSWER = '{"name":"Ann","age":31}'
THOUGHT = (
    "Let me think about this step by step. The user wants a person as JSON, with a name and "
    "an age; I should pick the values from the question and check the types < and > "
    "carefully. "
) * 8
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


def parser_cost(tokenizer: object, rounds: int = 20) -> dict[str, float]:
    """Microseconds per piece of output, a piece being one token's text."""
    text = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
    pieces = [tokenizer.decode([t]) for t in tokenizer.encode(text, add_special_tokens=False)]  # type: ignore[attr-defined]
    readers = {
        "pass-through": lambda: AnswerReader(),
        "reasoning": lambda: AnswerReader(ReasoningParser(QWEN3)),
        "reasoning+tools": lambda: AnswerReader(ReasoningParser(QWEN3), ToolCallParser(HERMES)),
    }
    out = {}
    for name, make in readers.items():
        times = []
        for _ in range(rounds):
            reader = make()
            start = time.perf_counter()
            for piece in pieces:
                reader.feed(piece)
            reader.finish()
            times.append((time.perf_counter() - start) / len(pieces) * 1e6)
        out[name] = statistics.median(times)
    return out


def mask_cost(tokenizer: object, llg: object, constraint: Constraint, text: str) -> list[float]:
    """Microseconds to fill each step's mask and advance by the step's token."""
    ids = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    matcher = LLMatcher(llg, grammar_text(constraint), log_level=0)
    mask = allocate_token_bitmask(1, llg.vocab_size)  # type: ignore[attr-defined]
    times = []
    for token in ids:
        start = time.perf_counter()
        fill_next_token_bitmask(matcher, mask, 0)
        assert matcher.consume_token(token), matcher.get_error()
        times.append((time.perf_counter() - start) * 1e6)
    return times


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(hostinfo.describe())
    tokenizer = load_tokenizer(resolve_model(None))
    llg = grammar_vocabulary(tokenizer, len(tokenizer), [tokenizer.eos_token_id]).tokenizer
    for name, us in parser_cost(tokenizer).items():
        print(f"parser {name:16s} {us:6.2f} us/piece")
    schema = Constraint.json_schema(SCHEMA)
    thinking = f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}"
    plain = mask_cost(tokenizer, llg, schema, ANSWER)
    both = mask_cost(tokenizer, llg, schema.after_thinking(Thinking()), thinking)
    answer_steps = len(tokenizer.encode(ANSWER, add_special_tokens=False))  # type: ignore[attr-defined]
    rows = [
        ("json alone", plain),
        ("think then json: thinking", both[:-answer_steps]),
        ("think then json: the json", both[-answer_steps:]),
    ]
    for name, times in rows:
        print(f"mask {name:28s} {statistics.median(times):7.1f} us/step, median of {len(times)}")


if __name__ == "__main__":
    main()
