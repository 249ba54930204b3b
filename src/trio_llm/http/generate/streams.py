"""A request's generations, fanned in: one stream of (prompt index, output) from the
`generate()` of each of its prompts, framed as server-sent events (or as the builder says:
Ollama's one JSON object a line) or collected into finished outputs.

Invariants:
- Every generation runs in the request's own task or in a nursery held by a context manager
  entered in that task (Quart enters a streamed body's context around its whole send loop), never
  inside an async generator. So a client that goes away cancels the request's task, the
  cancellation unwinds through every `generate()`, and that aborts each engine request.
- Once the 200 of a stream is out, an error becomes the builder's failure events
  (`translate_error`, then `Builder.fail`: an error object for chat and completions, a
  `response.failed` for the Responses API), followed, like every stream's end, by the builder's
  closing bytes (`[DONE]`; nothing for the Responses API).
- Streaming responses have `timeout = None`: Quart's 60 s default would silently cut them.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import trio
from quart import Response
from quart.wrappers.response import ResponseBody

from trio_llm.http.errors import ProtocolError, translate_error
from trio_llm.http.runtime.metrics import ModelMetrics, RequestRecorder
from trio_llm.http.sse import sse_event
from trio_llm.outputs import CompletionOutput, RequestOutput

Generations = list[AsyncGenerator[RequestOutput, None]]
"""One `generate()` per prompt of the request, in prompt order, not yet iterated."""


@dataclass(frozen=True, slots=True)
class Framing:
    """How a stream's chunks go on the wire: server-sent events (OpenAI's, Anthropic's) or
    one JSON object a line (Ollama's NDJSON)."""

    frame: Callable[[Any], bytes]
    mimetype: str


SSE = Framing(sse_event, "text/event-stream")


class Builder(Protocol):
    """What turns a request's outputs into the chunks of its stream (each API's build.py).
    A builder with a `framing` attribute is framed that way; without one, as SSE."""

    done: bytes
    """What closes the stream after its last event (`data: [DONE]`, or nothing)."""

    def begin(self) -> list[Any]: ...
    def feed(self, prompt_index: int, output: RequestOutput) -> list[Any]: ...
    def end(self) -> list[Any]: ...
    def fail(self, error: ProtocolError) -> list[Any]:
        """The events that tell the client the stream failed after its 200 went out."""
        ...


async def _indexed(
    index: int, outputs: AsyncIterator[RequestOutput], recorder: RequestRecorder
) -> AsyncIterator[tuple[int, RequestOutput]]:
    async for output in outputs:
        recorder.record(output)
        yield index, output


@asynccontextmanager
async def merged(
    generations: Generations, metrics: ModelMetrics
) -> AsyncIterator[AsyncIterator[tuple[int, RequestOutput]]]:
    """Outputs of all of a request's prompts as (prompt index, output), as they arrive.

    One prompt is iterated directly. Several run side by side in a nursery held by this
    context (never inside an async generator); leaving the context early cancels them all,
    and each cancelled `generate()` aborts its engine request."""
    if len(generations) == 1:
        async with (
            aclosing(generations[0]) as only,
            aclosing(_indexed(0, only, metrics.recorder())) as outputs,
        ):
            yield outputs
        return

    async def produce(
        index: int, generation: AsyncGenerator[RequestOutput, None], send: trio.MemorySendChannel
    ) -> None:
        async with send, aclosing(generation):
            recorder = metrics.recorder()
            try:
                async for output in generation:
                    recorder.record(output)
                    await send.send((index, output))
            except Exception as error:  # delivered in order, raised by the consumer
                await send.send((index, error))

    async def consume(
        receive: trio.MemoryReceiveChannel,
    ) -> AsyncIterator[tuple[int, RequestOutput]]:
        async for index, item in receive:
            if isinstance(item, Exception):
                raise item
            yield index, item

    send, receive = trio.open_memory_channel[tuple[int, Any]](0)
    async with receive, trio.open_nursery() as nursery:
        async with send:
            for index, generation in enumerate(generations):
                nursery.start_soon(produce, index, generation, send.clone())
        try:
            async with aclosing(consume(receive)) as outputs:
                yield outputs
        finally:
            nursery.cancel_scope.cancel()


async def collect(generations: Generations, metrics: ModelMetrics) -> list[RequestOutput]:
    """Each prompt's finished output (FINAL_ONLY), in prompt order."""
    per_prompt: list[list[RequestOutput]] = [[] for _ in generations]
    async with merged(generations, metrics) as outputs:
        async for index, output in outputs:
            per_prompt[index].append(output)
    return [merge_final(outputs) for outputs in per_prompt]


def merge_final(outputs: Iterable[RequestOutput]) -> RequestOutput:
    """One finished RequestOutput from a FINAL_ONLY stream, whether the n choices arrived
    together or one by one: the last output seen for each choice index wins."""
    merged: RequestOutput | None = None
    choices: dict[int, CompletionOutput] = {}
    for output in outputs:
        merged = output
        for o in output.outputs:
            choices[o.index] = o
    if merged is None:
        raise ValueError("the engine finished the request without any output")
    merged.outputs = [choices[i] for i in sorted(choices)]
    return merged


class _ContextBody(ResponseBody):
    """A response body produced inside an async context manager. Quart enters it around the
    whole send loop, in the request's task, so the context may hold a nursery (running one
    `generate()` per prompt) that an async generator alone may not."""

    def __init__(self, context: AbstractAsyncContextManager[AsyncIterator[bytes]]) -> None:
        self._context = context

    async def __aenter__(self) -> AsyncIterator[bytes]:  # type: ignore[override]
        return await self._context.__aenter__()

    async def __aexit__(  # type: ignore[override]
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        return await self._context.__aexit__(exc_type, exc, tb)


Settle = Callable[[], Awaitable[None]]
"""What must be done after a request's last output and before its response ends (storing a
response that a next request may continue)."""


async def _nothing_to_settle() -> None:
    await trio.lowlevel.checkpoint()


async def _sse_events(
    outputs: AsyncIterator[tuple[int, RequestOutput]], builder: Builder, settle: Settle
) -> AsyncIterator[bytes]:
    frame = _framing(builder).frame
    try:
        for chunk in builder.begin():
            yield frame(chunk)
        async for index, output in outputs:
            for chunk in builder.feed(index, output):
                yield frame(chunk)
        last = builder.end()
        await settle()
        for chunk in last:
            yield frame(chunk)
    except Exception as error:  # the 200 is out: the error becomes an event
        for chunk in builder.fail(translate_error(error)):
            yield frame(chunk)
    if builder.done:
        yield builder.done


@asynccontextmanager
async def _sse_stream(
    generations: Generations, builder: Builder, metrics: ModelMetrics, settle: Settle
) -> AsyncIterator[AsyncIterator[bytes]]:
    async with (
        merged(generations, metrics) as outputs,
        aclosing(_sse_events(outputs, builder, settle)) as events,
    ):
        yield events


def _framing(builder: Builder) -> Framing:
    return getattr(builder, "framing", SSE)


def sse_response(
    generations: Generations,
    builder: Builder,
    metrics: ModelMetrics,
    settle: Settle = _nothing_to_settle,
) -> Response:
    """The generations as one SSE stream of `builder`'s chunks (or framed as the builder
    says: Ollama's NDJSON); `settle` runs between the builder's last chunks being made and
    their going out."""
    response = Response(
        _ContextBody(_sse_stream(generations, builder, metrics, settle)),
        mimetype=_framing(builder).mimetype,
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None
    return response
