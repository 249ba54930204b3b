"""The transcriptions in flight on the frontend side of a speech engine, and the request path
from an audio file to the engine.

What it owns: turning what a caller gives (an audio file's bytes, a path, or samples) into 16
kHz samples on a worker thread (decoding a long file takes a while, and the event loop serves
every other stream meanwhile), checking the options against the model (its languages, whether
it translates) before anything is sent, cutting the samples into ring-sized `AudioChunk`s, and
one `TranscriptionStream` per request, which the output handler feeds and the caller drains.

Invariants: like the output processor, the output handler's side never waits: a stream
appends what arrives (a slow consumer gets several windows' segments at once, never an
unbounded queue of wake-ups). A request is forgotten as soon as it finishes or its caller
leaves, so a late output for it is ignored; leaving early aborts it in the engine, which stops
within the window it is decoding.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import aclosing
from typing import TYPE_CHECKING

import anyio
import anyio.to_thread
import msgspec
import numpy as np

from trio_llm.client.errors import EngineRequestError, InvalidPromptError
from trio_llm.ipc.codec import encode
from trio_llm.ipc.messages import (
    AbortRequests,
    AudioChunk,
    EngineCoreOutput,
    TranscriptionRequest,
)
from trio_llm.outputs import TranscriptionOutput, TranscriptionSegment
from trio_llm.speech.audio import SAMPLE_RATE, AudioError, decode_audio, too_long
from trio_llm.speech.languages import language_code

if TYPE_CHECKING:
    from trio_llm.ipc.messages import EngineReady

AudioInput = bytes | str | os.PathLike[str] | np.ndarray
"""An audio file's contents, a path to one, or 16 kHz mono samples (float in [-1, 1], or
int16)."""

CHUNK_SAMPLES = 1 << 18
"""Samples per `AudioChunk` (512 KiB, 16 s): far below any ring's message limit."""

TASKS = ("transcribe", "translate")


class TranscriptionStream:
    """One request's outputs as they arrive; `get` waits for the next (merged) one."""

    __slots__ = (
        "_error",
        "_finished",
        "_language",
        "_new",
        "_position",
        "_probability",
        "_updated",
        "duration",
        "request",
        "segments",
    )

    def __init__(self, request: TranscriptionRequest, duration: float) -> None:
        self.request = request
        self.duration = duration
        self.segments: list[TranscriptionSegment] = []
        self._new: list[TranscriptionSegment] = []
        self._updated = anyio.Event()
        self._finished = False
        self._error: BaseException | None = None
        self._language = request.language or ""
        self._probability = 1.0
        self._position = 0.0

    def push(self, output: EngineCoreOutput) -> None:
        if output.speech is not None:
            self._new.extend(output.speech.segments)
            self.segments.extend(output.speech.segments)
            self._language = output.speech.language or self._language
            self._probability = output.speech.language_probability
            self._position = output.speech.position
        if output.finish_reason == "stop":
            self._finished = True
            self._position = self.duration
        elif output.finish_reason is not None:
            message = output.error or "the transcription was aborted"
            self._error = EngineRequestError(message)
        self._updated.set()

    def fail(self, error: BaseException) -> None:
        self._error = error
        self._updated.set()

    async def get(self) -> TranscriptionOutput:
        """The segments since the last call (at least one output's worth); raises what failed
        the request."""
        await self._updated.wait()
        if self._error is not None:
            raise self._error
        self._updated = anyio.Event()
        new, self._new = self._new, []
        r = self.request
        return TranscriptionOutput(
            request_id=r.request_id,
            new_segments=new,
            segments=list(self.segments),
            task=r.task,
            language=self._language,
            language_probability=self._probability,
            duration=self.duration,
            position=self._position,
            finished=self._finished,
        )


class PendingTranscriptions:
    def __init__(self) -> None:
        self._streams: dict[str, TranscriptionStream] = {}

    @property
    def num_requests(self) -> int:
        return len(self._streams)

    def has_request(self, request_id: str) -> bool:
        return request_id in self._streams

    def add(self, request: TranscriptionRequest, duration: float) -> TranscriptionStream:
        """Track a request before it is sent, so no output can arrive for an unknown id."""
        if request.request_id in self._streams:
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        stream = self._streams[request.request_id] = TranscriptionStream(request, duration)
        return stream

    def remove(self, request_id: str) -> bool:
        """Forget a request whose caller has gone; True if the engine may still have it."""
        return self._streams.pop(request_id, None) is not None

    def process_outputs(self, outputs: Sequence[EngineCoreOutput], now: float) -> list[str]:
        """Feed one engine step's outputs to their streams; nothing to abort (the signature is
        the output processor's)."""
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue
            stream.push(output)
            if output.finish_reason is not None:
                del self._streams[output.request_id]
        return []

    def abort_request(self, request_id: str) -> list[str]:
        """Fail a request from elsewhere (`EngineClient.abort`); its engine id to abort."""
        stream = self._streams.pop(request_id, None)
        if stream is None:
            return []
        stream.fail(EngineRequestError("the request was aborted"))
        return [request_id]

    def fail_all(self, make_error: Callable[[], BaseException]) -> None:
        for stream in self._streams.values():
            stream.fail(make_error())
        self._streams.clear()


async def final_output(
    outputs: AsyncGenerator[TranscriptionOutput, None], first: TranscriptionOutput | None = None
) -> TranscriptionOutput:
    """The finished transcription: the last of `outputs` (after `first`, one already taken)."""
    final = first
    async with aclosing(outputs) as stream:
        async for output in stream:
            final = output
    if final is None or not final.finished:
        raise EngineRequestError("the transcription ended without its last window")
    return final


def check_options(
    model: EngineReady, *, task: str, language: str | None, temperature: float
) -> str | None:
    """The language's code, once the options are known to suit the model; otherwise
    `InvalidPromptError` naming the field to fix."""
    if task not in TASKS:
        raise InvalidPromptError(
            f"task must be one of {', '.join(TASKS)}, got {task!r}", param="task"
        )
    languages = model.languages or ["en"]
    if task == "translate" and len(languages) == 1:
        raise InvalidPromptError(
            f"the model {model.model!r} knows only English, so it cannot translate; serve a "
            "multilingual Whisper model (e.g. whisper-base) for /v1/audio/translations",
            param="model",
        )
    if not 0.0 <= temperature <= 1.0:
        raise InvalidPromptError(
            f"temperature must be between 0 and 1, got {temperature}", param="temperature"
        )
    if language is None:
        return None
    code = language_code(language)
    if code is None:
        raise InvalidPromptError(
            f"unknown language {language!r}; give an ISO-639-1 code such as 'en' or 'fr'",
            param="language",
        )
    if code not in languages:
        raise InvalidPromptError(
            f"the model {model.model!r} knows only English; it cannot transcribe {language!r}",
            param="language",
        )
    return code


async def samples_of(audio: AudioInput, max_seconds: float | None) -> np.ndarray:
    """16 kHz int16 samples of `audio`, a file decoded on a worker thread (`AudioError` when
    it cannot be, or is longer than `max_seconds`)."""
    if isinstance(audio, np.ndarray):
        return _as_int16(audio, max_seconds)
    if not isinstance(audio, bytes | bytearray | memoryview):
        audio = await anyio.Path(audio).read_bytes()
    return await anyio.to_thread.run_sync(
        lambda: decode_audio(bytes(audio), max_seconds=max_seconds), abandon_on_cancel=True
    )


def _as_int16(samples: np.ndarray, max_seconds: float | None) -> np.ndarray:
    if samples.ndim != 1:
        raise AudioError(f"samples must be one channel (a 1-d array), got shape {samples.shape}")
    if samples.size == 0:
        raise AudioError("the audio holds no samples")
    if max_seconds is not None and samples.size > max_seconds * SAMPLE_RATE:
        raise too_long(max_seconds)
    if samples.dtype == np.int16:
        return samples
    if not np.issubdtype(samples.dtype, np.floating):
        raise AudioError(f"samples must be float or int16, got {samples.dtype}")
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


async def transcription_stream(
    pending: PendingTranscriptions,
    post: Callable[[bytes], None],
    check_alive: Callable[[], None],
    audio: AudioInput,
    request: TranscriptionRequest,
    max_seconds: float | None,
) -> AsyncGenerator[TranscriptionOutput, None]:
    """Decode, send, and yield the request's outputs until it finishes; leaving early (break,
    an exception, cancellation) aborts it in the engine."""
    samples = await samples_of(audio, max_seconds)
    check_alive()
    request = msgspec.structs.replace(
        request, num_samples=int(samples.size), arrival_time=time.time()
    )
    stream = pending.add(request, samples.size / SAMPLE_RATE)
    rid = request.request_id
    try:
        post(encode(request))
        pcm = samples.astype("<i2", copy=False)
        for start in range(0, pcm.size, CHUNK_SAMPLES):
            post(
                encode(
                    AudioChunk(request_id=rid, samples=pcm[start : start + CHUNK_SAMPLES].tobytes())
                )
            )
        while True:
            output = await stream.get()
            yield output
            if output.finished:
                break
    finally:
        # No await here: this runs when the scope is cancelled too (as in generate()).
        if pending.remove(rid):
            post(encode(AbortRequests(request_ids=[rid])))


def new_request(
    *,
    request_id: str | None,
    task: str,
    language: str | None,
    prompt: str | None,
    temperature: float,
    word_timestamps: bool,
    priority: int,
) -> TranscriptionRequest:
    return TranscriptionRequest(
        request_id=request_id or uuid.uuid4().hex,
        num_samples=0,
        task=task,
        language=language,
        prompt=prompt,
        temperature=temperature,
        word_timestamps=word_timestamps,
        priority=priority,
    )
