"""Per-request collectors: the hand-off between the output handler and one `generate()` call.

What it owns: the outputs produced for one request (all of its `n` choices) that its consumer has
not taken yet. Invariants:
- `put()` and `fail()` never block and never checkpoint, so the single output handler that
  serves every request is never held up by a slow consumer.
- Memory stays bounded whatever the consumer's pace: at most one pending output per choice. In
  DELTA mode a new delta is merged into the pending one (text concatenated, tokens and logprobs
  appended); in CUMULATIVE and FINAL_ONLY modes the newer state of a choice replaces the older.
  So a consumer that lags sees fewer, larger outputs, never a queue.
"""

from __future__ import annotations

import dataclasses

import anyio
import anyio.lowlevel

from trio_llm.outputs import CompletionOutput, PositionLogprobs, RequestMetrics, RequestOutput
from trio_llm.sampling_params import RequestOutputKind


def _merge_delta(pending: CompletionOutput, new: CompletionOutput, texts: list[str]) -> None:
    """Fold `new` into `pending`; its text goes to `texts`, joined once when taken (adding it
    to `pending.text` each time would copy the growing text once per merge)."""
    texts.append(new.text)
    pending.token_ids.extend(new.token_ids)
    if new.logprobs is not None:
        if pending.logprobs is None:
            pending.logprobs = list(new.logprobs)
        else:
            pending.logprobs.extend(new.logprobs)
    pending.cumulative_logprob = new.cumulative_logprob
    pending.finish_reason = new.finish_reason
    pending.stop_reason = new.stop_reason


class RequestCollector:
    """One `generate()` call's outputs, waiting for its consumer."""

    def __init__(
        self,
        request_id: str,
        prompt: str | None,
        prompt_token_ids: list[int],
        *,
        n: int,
        kind: RequestOutputKind,
        arrival_time: float,
        stream_interval: int = 1,
    ) -> None:
        self.request_id = request_id
        self.prompt = prompt
        self.prompt_token_ids = prompt_token_ids
        self.n = n
        self.kind = RequestOutputKind(kind)
        self.metrics = RequestMetrics(arrival_time=arrival_time)
        """Updated in place by the output processor; each output carries a copy."""
        self.prompt_logprobs: list[PositionLogprobs | None] | None = None
        self._pending: dict[int, CompletionOutput] = {}
        self._merged_texts: dict[int, list[str]] = {}
        """DELTA: text of deltas merged into a pending output since it was put, by choice."""
        self._latest: dict[int, CompletionOutput] = {}
        """CUMULATIVE and FINAL_ONLY: every choice's newest state, already delivered or not."""
        self._finished_choices: set[int] = set()
        self._prompt_logprobs_sent = False
        self._error: BaseException | None = None
        self._wakeup: anyio.Event | None = None
        self._stream_interval = stream_interval
        self._steps_pending = 0
        """Outputs `put` since the consumer last took (one per running choice per step)."""
        self._delivered = False
        self.started = False
        """The engine sent an output for this request (the router may not move it); set by
        the output processor, whether or not the output is for the consumer yet."""

    @property
    def finished(self) -> bool:
        """Every choice has finished (its last output may still be pending)."""
        return len(self._finished_choices) == self.n

    def put(self, completion: CompletionOutput) -> None:
        """Leave one choice's progress for the consumer; never blocks."""
        if completion.finish_reason is not None:
            self._finished_choices.add(completion.index)
        pending = self._pending.get(completion.index)
        if pending is not None and self.kind is RequestOutputKind.DELTA:
            _merge_delta(pending, completion, self._merged_texts.setdefault(completion.index, []))
        else:
            self._pending[completion.index] = completion
        self._steps_pending += 1
        if self._ready():
            self._wake()

    def fail(self, error: BaseException) -> None:
        """Make the consumer's `get()` raise `error` once it has taken what is pending (the
        first error wins)."""
        if self._error is None:
            self._error = error
            self._wake()

    async def get(self) -> RequestOutput:
        """Wait for the next output: whatever accumulated since the previous call."""
        await anyio.lowlevel.checkpoint()
        while not self._ready():
            self._wakeup = anyio.Event()
            await self._wakeup.wait()
        return self.get_nowait()

    def get_nowait(self) -> RequestOutput:
        """The next output if there is one, else raise `anyio.WouldBlock`.

        After `fail()`, what streamed before the failure is still delivered first (a consumer
        of a dead engine gets every token it published), then the error is raised."""
        if self._error is not None:
            if self._pending and self.kind is not RequestOutputKind.FINAL_ONLY:
                return self._take()
            raise self._error
        if not self._ready():
            raise anyio.WouldBlock
        return self._take()

    def _ready(self) -> bool:
        if self._error is not None:
            return True
        if self.kind is RequestOutputKind.FINAL_ONLY:
            return self.finished and bool(self._pending)
        if not self._pending:
            return False
        # The first output goes at once (time to first token is not traded away); then every
        # `stream_interval` steps of the running choices, or as soon as a choice ends.
        running = self.n - len(self._finished_choices)
        return (
            not self._delivered
            or self._steps_pending >= self._stream_interval * running
            or any(c.finish_reason is not None for c in self._pending.values())
        )

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()
            self._wakeup = None

    def _take(self) -> RequestOutput:
        if self.kind is RequestOutputKind.DELTA:
            for index, texts in self._merged_texts.items():
                pending = self._pending[index]
                pending.text = "".join([pending.text, *texts])
            self._merged_texts = {}
            outputs = [self._pending[i] for i in sorted(self._pending)]
            prompt_logprobs = None if self._prompt_logprobs_sent else self.prompt_logprobs
            self._prompt_logprobs_sent = prompt_logprobs is not None
        else:
            self._latest.update(self._pending)
            outputs = [self._latest[i] for i in sorted(self._latest)]
            prompt_logprobs = self.prompt_logprobs
        self._pending = {}
        self._steps_pending = 0
        self._delivered = True
        return RequestOutput(
            request_id=self.request_id,
            prompt=self.prompt,
            prompt_token_ids=self.prompt_token_ids,
            outputs=outputs,
            finished=self.finished,
            metrics=dataclasses.replace(self.metrics),
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.metrics.num_cached_tokens,
        )
