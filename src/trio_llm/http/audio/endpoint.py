"""POST /v1/audio/transcriptions and /v1/audio/translations: OpenAI's multipart forms, on a
model served for speech to text (a Whisper model's speech engine).

The order is the generating endpoints': read the form (415 unless multipart, 413 naming
`file` past --max-audio-size), check the model (404, or 400 when it does not serve speech),
plan (400 naming the field), admit, route to the least-loaded replica, check the options
against it (its languages; translation needs a multilingual model), decode the file on a worker
thread (400 naming `file` for an empty or non-audio file, 413 past --max-audio-seconds), and
wait for the first window, so that every one of these is a status code, never an event after
a stream's 200; then stream the transcript events or collect the whole transcription. Nothing
reaches the engine before every check has passed. A request that names no model gets the
first one served for speech to text.

As with generation, a client that goes away cancels the handler (or the stream's body), and
the cancellation unwinding through `transcribe()` aborts the request in the engine, which stops
within the window it is decoding.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from typing import Any

import anyio.to_thread
from quart import Response, request
from werkzeug.datastructures import FileStorage

from trio_llm.client.speech import final_output
from trio_llm.http.audio.build import TranscriptStream, response_body
from trio_llm.http.audio.plan import plan_audio
from trio_llm.http.audio.protocol import AudioForm
from trio_llm.http.errors import ProtocolError, bad_request, translate_error
from trio_llm.http.ids import new_response_id
from trio_llm.http.runtime.middleware import check_priority
from trio_llm.http.runtime.state import current_state
from trio_llm.http.sse import sse_event
from trio_llm.http.wire import convert_request
from trio_llm.outputs import TranscriptionOutput

TASK = "transcribe"
"""What the engine of a model serving these routes does (translation included)."""

FORM_SLACK = 1 << 20
"""Bytes a form may hold beyond its file (the other fields, the part headers)."""

_LIST_FIELDS = frozenset({"timestamp_granularities", "include"})

Outputs = AsyncGenerator[TranscriptionOutput, None]


async def transcriptions() -> Response:
    return await _serve("transcribe")


async def translations() -> Response:
    return await _serve("translate")


async def _serve(task: str) -> Response:
    state = current_state()
    config = state.config
    fields, file = await _read_form(config.max_audio_size)
    form = convert_request(fields, AudioForm)
    check_priority(form.priority)
    model_name = form.model or state.first_served(TASK)
    served, _ = state.model_for(model_name, task=TASK)  # 404 or 400 before anything else
    plan = plan_audio(form, task, fields)
    state.admit(served, 1)
    lease, model = state.lease(model_name, task=TASK, sequences=1)
    outputs = lease.transcribe(
        await anyio.to_thread.run_sync(file.stream.read),  # a spooled upload: maybe on disk
        task=plan.task,
        language=plan.language,
        prompt=plan.prompt,
        temperature=plan.temperature,
        word_timestamps=plan.words,
        max_seconds=config.max_audio_seconds,
        request_id=new_response_id("audio-", form.request_id),
        priority=form.priority,
    )
    first = await anext(outputs)  # decoded, sent, and the first window's segments back
    state.metrics.audio_seconds.labels(model.name).inc(first.duration)
    if plan.stream:
        response = Response(
            _events(first, outputs, TranscriptStream()),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        response.timeout = None
        return response
    final = await final_output(outputs, first)
    body, mimetype = response_body(plan, final)
    return Response(body, mimetype=mimetype)


async def _read_form(max_audio_size: int) -> tuple[dict[str, Any], FileStorage]:
    """The form's text fields (list fields as lists, `name[]` read as `name`) and its file."""
    if request.mimetype != "multipart/form-data":
        raise ProtocolError(
            415,
            f"Content-Type must be multipart/form-data, got {request.mimetype or 'none'}",
            code="unsupported_media_type",
        )
    length = request.content_length
    if length is not None and length > max_audio_size + FORM_SLACK:
        raise _too_large(max_audio_size)
    form = await request.form
    files = await request.files
    file = files.get("file")
    if file is None:
        raise bad_request("file: this field is required (the audio file)", param="file")
    file.stream.seek(0, os.SEEK_END)
    if file.stream.tell() > max_audio_size:
        raise _too_large(max_audio_size)
    file.stream.seek(0)
    fields: dict[str, Any] = {}
    for key in form:
        name = key.removesuffix("[]")
        values = form.getlist(key)
        fields[name] = values if name in _LIST_FIELDS or key.endswith("[]") else values[-1]
    return fields, file


def _too_large(limit: int) -> ProtocolError:
    return ProtocolError(
        413,
        f"file: the audio file is larger than the limit of {limit} bytes (--max-audio-size)",
        param="file",
    )


async def _events(
    first: TranscriptionOutput, outputs: Outputs, builder: TranscriptStream
) -> AsyncIterator[bytes]:
    """The stream's body: no nursery is opened here, so yielding is safe; closing this
    generator (a client gone) closes `transcribe()`, which aborts the engine request."""
    async with aclosing(outputs) as stream:
        try:
            for event in builder.feed(first):
                yield sse_event(event)
            async for output in stream:
                for event in builder.feed(output):
                    yield sse_event(event)
            for event in builder.end():
                yield sse_event(event)
        except Exception as error:  # the 200 is out: the error becomes an event
            for event in builder.fail(translate_error(error)):
                yield sse_event(event)
