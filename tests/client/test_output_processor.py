"""Output processing and collectors, driven by scripted engine outputs (no engine process)."""

from __future__ import annotations

import contextlib
from typing import Any

import anyio
import pytest

from trio_llm.client.collector import RequestCollector
from trio_llm.client.errors import EngineDeadError, EngineRequestError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.client.output_processor import OutputProcessor
from trio_llm.client.stop_strings import held_back
from trio_llm.constraint import Constraint
from trio_llm.ipc.messages import EngineCoreOutput, TokenLogprobs
from trio_llm.outputs import CompletionOutput, RequestOutput
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

pytestmark = pytest.mark.anyio

DELTA, CUMULATIVE, FINAL = (
    RequestOutputKind.DELTA,
    RequestOutputKind.CUMULATIVE,
    RequestOutputKind.FINAL_ONLY,
)


class Harness:
    """One request registered with an OutputProcessor, fed token by token."""

    def __init__(self, tokenizer: Any, params: SamplingParams, request_id: str = "r") -> None:
        self.tokenizer = tokenizer
        self.processor = OutputProcessor(tokenizer, [tokenizer.convert_tokens_to_ids("<|im_end|>")])
        prompt = tokenizer.encode("Tell me:")
        self.collector = RequestCollector(
            request_id, None, prompt, n=params.n, kind=params.output_kind, arrival_time=0.0
        )
        self.engine_requests = InputProcessor.engine_requests(
            request_id, prompt, params, arrival_time=0.0
        )
        self.processor.add_request(self.collector, self.engine_requests)
        self.aborted: list[str] = []

    def feed(self, *outputs: EngineCoreOutput) -> None:
        self.aborted += self.processor.process_outputs(outputs, now=1.0)

    def tokens(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def stream(self, text: str, engine_id: str = "r", finish: str | None = "length") -> None:
        ids = self.tokens(text)
        for k, token in enumerate(ids):
            last = k == len(ids) - 1
            self.feed(
                EngineCoreOutput(
                    request_id=engine_id,
                    new_token_ids=[token],
                    finish_reason=finish if last else None,
                )
            )

    def drain(self) -> list[RequestOutput]:
        """Every output the consumer can take now."""
        seen = []
        while True:
            try:
                seen.append(self.collector.get_nowait())
            except anyio.WouldBlock:
                return seen


async def test_delta_stream_is_the_whole_text_with_tokens(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, max_tokens=100))
    text = "Paris is the capital of France 🇫🇷."
    pieces = []
    for token in h.tokens(text):
        h.feed(EngineCoreOutput(request_id="r", new_token_ids=[token]))
        out = await h.collector.get()
        pieces.append(out.outputs[0].text)
        assert not out.finished
    h.feed(EngineCoreOutput(request_id="r", new_token_ids=[], finish_reason="length"))
    last = await h.collector.get()
    assert last.finished and last.outputs[0].finish_reason == "length"
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert last.metrics.first_token_time == 1.0 and last.metrics.finished_time == 1.0
    assert h.processor.num_requests == 0


def test_a_lagging_consumer_gets_merged_deltas_and_the_handler_never_waits(
    tokenizer: Any,
) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, max_tokens=100))
    text = "One two three four five six seven eight nine ten"
    ids = h.tokens(text)
    h.stream(text)  # all of it arrives before the consumer looks: feed() returned every time
    (out,) = h.drain()
    assert out.finished
    assert out.outputs[0].text == text
    assert out.outputs[0].token_ids == ids


async def test_cumulative_outputs_carry_everything_so_far(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=CUMULATIVE, max_tokens=100))
    ids = h.tokens("Hello there, world")
    h.feed(EngineCoreOutput(request_id="r", new_token_ids=ids[:2]))
    first = await h.collector.get()
    h.feed(EngineCoreOutput(request_id="r", new_token_ids=ids[2:], finish_reason="length"))
    second = await h.collector.get()
    assert first.outputs[0].token_ids == ids[:2]
    assert second.outputs[0].text == "Hello there, world"
    assert second.outputs[0].token_ids == ids
    assert second.finished


def test_final_only_yields_once_when_every_choice_is_done(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=FINAL, n=2, max_tokens=100))
    h.stream("first answer", engine_id="0_r")
    h.stream("second", engine_id="1_r", finish=None)
    assert h.drain() == []
    h.feed(EngineCoreOutput(request_id="1_r", finish_reason="length"))
    (out,) = h.drain()
    assert [(c.index, c.text) for c in out.outputs] == [(0, "first answer"), (1, "second")]


def test_n_choices_arrive_as_one_stream_with_indexes(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, n=3, seed=7, max_tokens=100))
    assert [r.request_id for r in h.engine_requests] == ["0_r", "1_r", "2_r"]
    assert [r.sampling_params.seed for r in h.engine_requests] == [7, 8, 9]
    assert all(r.sampling_params.n == 1 for r in h.engine_requests)
    texts = {0: "alpha beta", 1: "gamma", 2: "delta epsilon zeta"}
    for index, text in texts.items():
        h.stream(text, engine_id=f"{index}_r")
    seen: dict[int, str] = {}
    for out in h.drain():
        for choice in out.outputs:
            seen[choice.index] = seen.get(choice.index, "") + choice.text
    assert seen == texts


def test_stop_string_is_held_back_cut_and_aborted(tokenizer: Any) -> None:
    params = SamplingParams(output_kind=DELTA, stop=["world!"], max_tokens=100)
    h = Harness(tokenizer, params)
    streamed = ""
    for token in h.tokens("Hello world peace, hello world! and more"):
        h.feed(EngineCoreOutput(request_id="r", new_token_ids=[token]))
        for out in h.drain():
            streamed += out.outputs[0].text
            # Whatever was streamed never ends inside a possible stop string.
            assert held_back(streamed, ["world!"]) == 0 or out.finished
        if h.aborted:
            break
    assert streamed == "Hello world peace, hello "
    assert out.finished
    assert out.outputs[0].finish_reason == "stop" and out.outputs[0].stop_reason == "world!"
    assert h.aborted == ["r"]  # the engine is told to stop generating
    # Tokens after the match are dropped, and outputs for the forgotten request are ignored.
    h.feed(EngineCoreOutput(request_id="r", new_token_ids=[5], finish_reason="abort"))
    assert h.processor.num_requests == 0


def test_include_stop_str_in_output(tokenizer: Any) -> None:
    params = SamplingParams(
        output_kind=CUMULATIVE, stop=["END"], include_stop_str_in_output=True, max_tokens=50
    )
    h = Harness(tokenizer, params)
    h.stream("abc END def", finish=None)
    (*_, last) = h.drain()
    assert last.outputs[0].text == "abc END"
    assert tokenizer.decode(last.outputs[0].token_ids).endswith("END")


def test_partial_stop_string_is_released_when_the_request_ends(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, stop=["STOPNOW"], max_tokens=50))
    h.stream("ends with STOP")
    (out,) = h.drain()
    assert out.outputs[0].text == "ends with STOP"
    assert out.outputs[0].finish_reason == "length"


def test_engine_stop_token_is_kept_in_ids_but_not_in_text(tokenizer: Any) -> None:
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for skip in (True, False):
        h = Harness(tokenizer, SamplingParams(output_kind=FINAL, skip_special_tokens=skip))
        ids = h.tokens("Done.")
        h.feed(EngineCoreOutput(request_id="r", new_token_ids=[*ids, eos], finish_reason="stop"))
        (out,) = h.drain()
        assert out.outputs[0].text == "Done."
        assert out.outputs[0].token_ids == [*ids, eos]


def test_a_grammar_end_keeps_its_last_token_and_an_eos_after_it_is_dropped(
    tokenizer: Any,
) -> None:
    """A constrained request stops where its grammar ends, on a token of the output (the
    engine's `stop` without EOS); one that ended on EOS drops it as usual."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    params = SamplingParams(output_kind=FINAL, constraint=Constraint.regex("[a-z]+\\}"))
    for tail, text in (([], '{"a":1}'), ([eos], '{"a":1}')):
        h = Harness(tokenizer, params)
        ids = [*h.tokens('{"a":1}'), *tail]
        h.feed(EngineCoreOutput(request_id="r", new_token_ids=ids, finish_reason="stop"))
        (out,) = h.drain()
        assert out.outputs[0].text == text


def test_logprobs_are_decoded_and_summed(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=FINAL, logprobs=1, prompt_logprobs=0))
    paris, rome = (tokenizer.encode(w, add_special_tokens=False)[0] for w in (" Paris", " Rome"))
    h.feed(
        EngineCoreOutput(
            request_id="r",
            new_token_ids=[paris],
            new_logprobs=[TokenLogprobs([paris, rome], [-0.5, -1.5], rank=1)],
            prompt_logprobs=[None, TokenLogprobs([rome], [-3.0], rank=9)],
        )
    )
    h.feed(
        EngineCoreOutput(
            request_id="r",
            new_token_ids=[rome],
            new_logprobs=[TokenLogprobs([rome, paris], [-2.0, -0.25], rank=2)],
            finish_reason="length",
        )
    )
    (out,) = h.drain()
    choice = out.outputs[0]
    assert choice.cumulative_logprob == pytest.approx(-2.5)
    assert choice.logprobs is not None
    first, second = choice.logprobs
    assert (first.chosen.decoded, first.chosen.logprob, first.chosen.rank) == (" Paris", -0.5, 1)
    assert [(t.decoded, t.rank) for t in first.top] == [(" Rome", 1)]
    assert second.chosen.rank == 2 and second.top[0].decoded == " Paris"
    assert out.prompt_logprobs is not None and out.prompt_logprobs[0] is None
    assert out.prompt_logprobs[1] is not None and out.prompt_logprobs[1].chosen.rank == 9


async def test_an_engine_error_fails_the_request_and_aborts_its_siblings(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, n=2))
    h.feed(EngineCoreOutput(request_id="0_r", finish_reason="error", error="NaN in logits"))
    with pytest.raises(EngineRequestError, match="NaN in logits"):
        await h.collector.get()
    assert h.aborted == ["1_r"]
    assert h.processor.num_requests == 0


def test_abort_request_finishes_locally_with_abort(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA, n=2))
    h.stream("partial", engine_id="0_r", finish=None)
    assert h.processor.abort_request("r", now=2.0) == ["0_r", "1_r"]
    (out,) = h.drain()
    assert out.finished
    assert [(c.index, c.finish_reason) for c in out.outputs] == [(0, "abort"), (1, "abort")]
    assert out.outputs[0].text == "partial"


async def test_fail_all_wakes_a_waiting_consumer(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams(output_kind=DELTA))
    async with anyio.create_task_group() as tg:
        tg.start_soon(_fail_soon, h.processor)
        with pytest.raises(EngineDeadError):
            await h.collector.get()


async def _fail_soon(processor: OutputProcessor) -> None:
    await anyio.wait_all_tasks_blocked()  # the consumer is parked in get()
    processor.fail_all(lambda: EngineDeadError("gone"))


def test_duplicate_request_ids_are_refused(tokenizer: Any) -> None:
    h = Harness(tokenizer, SamplingParams())
    with pytest.raises(ValueError, match="already in flight"):
        h.processor.add_request(h.collector, h.engine_requests)


def test_collector_merges_deltas_into_one_pending_output() -> None:
    collector = RequestCollector("r", None, [1], n=1, kind=DELTA, arrival_time=0.0)
    for k in range(1000):
        collector.put(CompletionOutput(index=0, text="x", token_ids=[k]))
    assert len(collector._pending) == 1  # bounded whatever the consumer's pace
    [merged] = collector.get_nowait().outputs
    assert (merged.text, merged.token_ids) == ("x" * 1000, list(range(1000)))


@pytest.mark.parametrize("interval", [1, 3])
def test_stream_interval_sends_the_first_token_at_once_then_every_interval(interval: int) -> None:
    """A consumer that keeps up sees outputs of 1, then `interval`, ..., then the remainder at
    the finish: the same tokens, in fewer wake-ups."""
    collector = RequestCollector(
        "r", None, [1], n=1, kind=DELTA, arrival_time=0.0, stream_interval=interval
    )
    sizes: list[int] = []
    tokens: list[int] = []
    for k in range(11):
        last = k == 10
        collector.put(
            CompletionOutput(
                index=0, text=str(k), token_ids=[k], finish_reason="length" if last else None
            )
        )
        try:
            out = collector.get_nowait()
        except anyio.WouldBlock:
            continue
        sizes.append(len(out.outputs[0].token_ids))
        tokens.extend(out.outputs[0].token_ids)
        assert out.finished == last
    assert tokens == list(range(11))
    expected = [1] * 11 if interval == 1 else [1, 3, 3, 3, 1]
    assert sizes == expected


def test_stream_interval_counts_steps_of_the_choices_still_running() -> None:
    """n=2, interval 2: once choice 0 has ended, choice 1 alone is delivered every 2 steps,
    not every 4."""
    collector = RequestCollector(
        "r", None, [1], n=2, kind=DELTA, arrival_time=0.0, stream_interval=2
    )
    taken: list[list[int]] = []

    def step(index: int, token: int, finish: str | None = None) -> None:
        collector.put(CompletionOutput(index, str(token), [token], finish_reason=finish))

    def take() -> None:
        with contextlib.suppress(anyio.WouldBlock):
            taken.append([len(c.token_ids) for c in collector.get_nowait().outputs])

    step(0, 1)
    step(1, 1)
    take()  # the first output goes at once
    step(0, 2, "stop")
    take()  # a choice ends: delivered at once
    for token in range(2, 6):
        step(1, token)
        take()
    assert taken == [[1, 1], [1], [2], [2]]
