"""OutputText behaves as the string it stands for, and a long output costs linear time."""

from __future__ import annotations

import time
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import example, given

from trio_llm.client import output_processor
from trio_llm.client.output_text import OutputText
from trio_llm.ipc.messages import EngineCoreOutput
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

from .test_output_processor import Harness

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.text(max_size=6)),
        st.tuples(st.just("truncate"), st.integers(0, 40)),
        st.tuples(st.just("slice"), st.tuples(st.integers(-3, 45), st.integers(-3, 45))),
        st.tuples(st.just("tail"), st.integers(0, 45)),
        st.tuples(st.just("str"), st.none()),
    ),
    max_size=40,
)


@given(_ops)
@example([("append", "00"), ("slice", (0, -1))])  # a negative end counts from the end
def test_output_text_is_the_string_it_stands_for(ops: list[tuple[str, Any]]) -> None:
    text, model = OutputText(), ""
    for op, arg in ops:
        if op == "append":
            text.append(arg)
            model += arg
        elif op == "truncate":
            text.truncate(arg)
            model = model[:arg]
        elif op == "slice":
            start, end = arg
            assert text.slice(max(start, 0), end) == model[max(start, 0) : end]
        elif op == "tail":
            assert text.tail(arg) == (model[-arg:] if arg else "")
        else:
            assert str(text) == model
        assert len(text) == len(model)
    assert str(text) == model


@pytest.mark.parametrize("kind", [RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY])
@pytest.mark.parametrize("stop", [None, ["never appears"]])
def test_a_long_output_costs_linear_time(
    tokenizer: Any, monkeypatch: pytest.MonkeyPatch, kind: RequestOutputKind, stop: list[str] | None
) -> None:
    """A complexity check, not a speed target: the last tokens of a long output cost what the
    first ones did. Each token decodes to a 4,000-character piece, which makes a text that is
    copied whole on every token (quadratic) cost ~20x more per token at the end than at the
    start, while a linear one costs the same; the bound of 4x leaves room for noise. CPU time of
    this process only, so other load on the machine does not count."""
    piece = "abcd" * 1000
    monkeypatch.setattr(output_processor.IncrementalDetokenizer, "step", lambda self, t: piece)
    tokens, window = 2000, 200
    h = Harness(tokenizer, SamplingParams(output_kind=kind, max_tokens=tokens, stop=stop))
    cost: list[float] = []
    for k in range(tokens):
        started = time.process_time()
        finish = "length" if k == tokens - 1 else None
        h.feed(EngineCoreOutput(request_id="r", new_token_ids=[7], finish_reason=finish))
        h.drain()
        cost.append(time.process_time() - started)
    first, last = sum(cost[:window]), sum(cost[-window - 1 : -1])
    assert last < 4 * max(first, 1e-3), (first, last)
