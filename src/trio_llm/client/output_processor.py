"""Output processing: engine outputs (token ids) become user-facing completions.

What it owns: the state of every request in flight on the frontend side, one `_Choice` per engine
request (a `generate()` call with `n > 1` has n of them, sharing one collector): incremental
detokenization, stop strings with hold-back, logprobs decoding, finish reasons and metrics.

Invariants:
- Everything here is synchronous and never waits: the output handler calls it for each engine
  step and it hands results to collectors, which never block.
- A choice whose request the engine must stop (a stop string matched, a sibling failed) is
  reported back as an engine request id to abort; the engine's own later 'abort' output for it
  is ignored, because the choice is forgotten as soon as it finishes here.
- The token that ended a request in the engine (EOS or a `stop_token_ids` entry) is kept in
  `token_ids` but its text is not, unless `include_stop_str_in_output` is set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from trio_llm.client.collector import RequestCollector
from trio_llm.client.detokenizer import DecodedTokens, IncrementalDetokenizer
from trio_llm.client.errors import EngineDeadError, EngineRequestError, UnservableRequestError
from trio_llm.client.output_text import OutputText
from trio_llm.client.stop_strings import find_stop, held_back
from trio_llm.ipc.messages import EngineCoreOutput, EngineCoreRequest, TokenLogprobs
from trio_llm.outputs import CompletionOutput, Logprob, PositionLogprobs
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Choice:
    """One engine request: one choice of a `generate()` call."""

    engine_id: str
    index: int
    collector: RequestCollector
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    text: OutputText = field(default_factory=OutputText)
    """Everything decoded so far (cut at a stop string once one matched)."""
    sent: int = 0
    """Characters of `text` handed to the collector; the rest is held back."""
    longest_stop: int = 0
    """The length of the longest stop string: how far back a match can begin."""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[PositionLogprobs] | None = None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass(eq=False)
class _Request:
    collector: RequestCollector
    choices: dict[str, _Choice]
    """Unfinished choices by engine request id."""


class OutputProcessor:
    """Routes engine outputs to the collectors of the requests in flight."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Collection[int] = ()
    ) -> None:
        self._tokenizer = tokenizer
        self._eos_token_ids = frozenset(eos_token_ids)
        self._decoded_token = DecodedTokens(tokenizer)
        self._choices: dict[str, _Choice] = {}
        self._requests: dict[str, _Request] = {}

    @property
    def num_requests(self) -> int:
        """`generate()` calls with at least one unfinished choice."""
        return len(self._requests)

    def decoded_token(self, token_id: int) -> str:
        """The text logprobs show for `token_id`."""
        return self._decoded_token(token_id)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._requests

    def add_request(
        self, collector: RequestCollector, engine_requests: Sequence[EngineCoreRequest]
    ) -> None:
        """Track a request before it is sent, so no output can arrive for an unknown id."""
        if collector.request_id in self._requests:
            raise ValueError(f"request id {collector.request_id!r} is already in flight")
        choices: dict[str, _Choice] = {}
        for index, engine_request in enumerate(engine_requests):
            params = engine_request.sampling_params
            choice = _Choice(
                engine_id=engine_request.request_id,
                index=index,
                collector=collector,
                params=params,
                detokenizer=IncrementalDetokenizer(
                    self._tokenizer,
                    engine_request.prompt_token_ids,
                    skip_special_tokens=params.skip_special_tokens,
                ),
            )
            if params.stop:
                choice.longest_stop = max(map(len, params.stop))
            if params.logprobs is not None:
                choice.logprobs = []
                choice.cumulative_logprob = 0.0
            choices[choice.engine_id] = choice
        self._requests[collector.request_id] = _Request(collector, choices)
        self._choices.update(choices)

    def process_outputs(self, outputs: Sequence[EngineCoreOutput], now: float) -> list[str]:
        """Apply one engine step's outputs; returns engine request ids the engine must abort."""
        to_abort: list[str] = []
        for output in outputs:
            choice = self._choices.get(output.request_id)
            if choice is None:
                continue  # finished or abandoned here already
            collector = choice.collector
            collector.started = True
            if output.finish_reason == "error":
                message = output.error or "the engine failed the request"
                if output.error_param is not None:
                    collector.fail(UnservableRequestError(message, param=output.error_param))
                else:
                    collector.fail(EngineRequestError(message))
                to_abort.extend(self._forget(collector.request_id, but=output.request_id))
                continue
            try:
                completion, stopped_here = self._update(choice, output, now)
            except Exception as exc:
                # A fault in one request's output handling must not stop every other stream.
                log.exception("output processing failed for request %s", collector.request_id)
                collector.fail(exc)
                to_abort.extend(self._forget(collector.request_id))
                continue
            if stopped_here:
                to_abort.append(choice.engine_id)
            if completion is not None:
                collector.put(completion)
            if choice.finish_reason is not None:
                self._finish(choice, now)
        return to_abort

    def abort_request(self, request_id: str, now: float) -> list[str]:
        """Finish a request here with finish_reason 'abort' (its consumer gets a last output);
        returns the engine request ids to abort."""
        request = self._requests.get(request_id)
        if request is None:
            return []
        engine_ids = list(request.choices)
        for choice in list(request.choices.values()):
            choice.finish_reason = "abort"
            request.collector.put(self._completion(choice, [], None, finished=True))
            self._finish(choice, now)
        return engine_ids

    def remove_request(self, request_id: str) -> list[str]:
        """Forget a request whose consumer has gone; returns its unfinished engine request ids."""
        return self._forget(request_id)

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every request in flight (each collector gets its own exception instance, told
        whether its request had started)."""
        for request in self._requests.values():
            error = make_error()
            if isinstance(error, EngineDeadError):
                error.started = request.collector.started
            request.collector.fail(error)
        self._requests.clear()
        self._choices.clear()

    # -- internals ----------------------------------------------------------------------

    def _forget(self, request_id: str, *, but: str | None = None) -> list[str]:
        request = self._requests.pop(request_id, None)
        if request is None:
            return []
        for engine_id in request.choices:
            del self._choices[engine_id]
        return [engine_id for engine_id in request.choices if engine_id != but]

    def _finish(self, choice: _Choice, now: float) -> None:
        del self._choices[choice.engine_id]
        request = self._requests[choice.collector.request_id]
        del request.choices[choice.engine_id]
        if not request.choices:
            choice.collector.metrics.finished_time = now
            del self._requests[choice.collector.request_id]

    def _update(
        self, choice: _Choice, output: EngineCoreOutput, now: float
    ) -> tuple[CompletionOutput | None, bool]:
        params = choice.params
        collector = choice.collector
        metrics = collector.metrics
        if output.num_cached_tokens and not metrics.num_cached_tokens:
            metrics.num_cached_tokens = output.num_cached_tokens
        if output.prompt_logprobs is not None and collector.prompt_logprobs is None:
            collector.prompt_logprobs = [
                None if entry is None else self._position(entry) for entry in output.prompt_logprobs
            ]
        token_ids = output.new_token_ids
        if token_ids:
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            metrics.last_token_time = now

        finish_reason, stop_reason = output.finish_reason, output.stop_reason
        # The engine stops on EOS or a stop token id: that token's text is not part of the output.
        # A constrained request also stops where its grammar ends, on a token of the output.
        detokenize = len(token_ids)
        if finish_reason == "stop" and not params.include_stop_str_in_output:
            grammar_end = params.constraint is not None and not (
                token_ids and (token_ids[-1] in self._eos_token_ids or token_ids[-1] == stop_reason)
            )
            if not grammar_end:
                detokenize -= 1
        stopped_here = False
        for k in range(max(detokenize, 0)):
            piece = choice.detokenizer.step(token_ids[k])
            if not piece:
                continue
            before = len(choice.text)
            choice.text.append(piece)
            if params.stop and (hit := _find_stop(choice, before)):
                at, stop = hit
                end = at + len(stop) if params.include_stop_str_in_output else at
                choice.text.truncate(end)
                finish_reason, stop_reason = "stop", stop
                token_ids = token_ids[: k + 1]
                stopped_here = True
                break

        new_logprobs: list[PositionLogprobs] | None = None
        if choice.logprobs is not None and output.new_logprobs:
            new_logprobs = [self._position(p) for p in output.new_logprobs[: len(token_ids)]]
            choice.logprobs.extend(new_logprobs)
            choice.cumulative_logprob = (choice.cumulative_logprob or 0.0) + sum(
                p.chosen.logprob for p in new_logprobs
            )
        choice.token_ids.extend(token_ids)
        choice.finish_reason, choice.stop_reason = finish_reason, stop_reason
        finished = finish_reason is not None
        if not token_ids and not finished:
            return None, False
        return self._completion(choice, token_ids, new_logprobs, finished=finished), stopped_here

    def _completion(
        self,
        choice: _Choice,
        new_token_ids: list[int],
        new_logprobs: list[PositionLogprobs] | None,
        *,
        finished: bool,
    ) -> CompletionOutput | None:
        """What the collector gets for this update, in the request's output kind."""
        limit = len(choice.text)
        if not finished and choice.params.stop:
            # A held-back prefix of a stop string is shorter than the longest stop string.
            limit -= held_back(choice.text.tail(choice.longest_stop), choice.params.stop)
        limit = max(limit, choice.sent)
        kind = choice.collector.kind
        if kind is RequestOutputKind.DELTA:
            text = choice.text.slice(choice.sent, limit)
            token_ids, logprobs = list(new_token_ids), new_logprobs
            if logprobs is None and choice.logprobs is not None:
                logprobs = []
        elif finished or kind is RequestOutputKind.CUMULATIVE:
            text = choice.text.slice(0, limit)
            token_ids = list(choice.token_ids)
            logprobs = None if choice.logprobs is None else list(choice.logprobs)
        else:
            return None  # FINAL_ONLY, not finished yet
        choice.sent = limit
        return CompletionOutput(
            index=choice.index,
            text=text,
            token_ids=token_ids,
            cumulative_logprob=choice.cumulative_logprob,
            logprobs=logprobs,
            finish_reason=choice.finish_reason,
            stop_reason=choice.stop_reason,
        )

    def _position(self, entry: TokenLogprobs) -> PositionLogprobs:
        ids, logprobs, text = entry.token_ids, entry.logprobs, self._decoded_token
        return PositionLogprobs(
            chosen=Logprob(ids[0], logprobs[0], entry.rank, text(ids[0])),
            top=[
                Logprob(token_id, logprob, rank, text(token_id))
                for rank, (token_id, logprob) in enumerate(zip(ids[1:], logprobs[1:]), start=1)
            ],
        )


def _find_stop(choice: _Choice, new_from: int) -> tuple[int, str] | None:
    """`find_stop` over the end of the text only: a match that reaches past `new_from` starts
    at most `longest_stop - 1` characters before it."""
    start = max(new_from - choice.longest_stop + 1, 0)
    hit = find_stop(choice.text.slice(start), new_from - start, choice.params.stop)
    return None if hit is None else (hit[0] + start, hit[1])
