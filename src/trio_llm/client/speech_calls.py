"""The speech engine's call: `transcribe` (and translate).

What it owns: `SpeechCalls`, the part of `EngineClient` (engine_client.py) that a speech engine
serves, as `PoolingCalls` (pooling_calls.py) is the part a pooling engine serves: the checks
made before anything is sent (the task, the options against the model), and the request handed
to its stream (speech.py: decoding the audio, the chunks, the outputs in flight).

Why a mixin: `transcribe` is an `EngineClient` method (one object per engine, what users call)
that shares its state (the table of transcriptions in flight, the request ring, the liveness
checks); `EngineClient` inherits it, and this module declares what it relies on.

Invariant: every check that can fail without the audio fails before `transcribe` returns;
leaving the iteration early aborts the request in the engine (speech.py).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from trio_llm.client.speech import (
    AudioInput,
    PendingTranscriptions,
    check_options,
    new_request,
    transcription_stream,
)
from trio_llm.ipc.messages import EngineReady

if TYPE_CHECKING:
    from trio_llm.outputs import TranscriptionOutput


class SpeechCalls:
    """The speech call of `EngineClient`, which provides what is declared here."""

    model_config: EngineReady
    _transcriptions: PendingTranscriptions

    if TYPE_CHECKING:  # EngineClient's, declared for the type checker only

        def _check_alive(self) -> None: ...

        def _check_task(self, use: str) -> None: ...

        def _post(self, message: bytes) -> None: ...

    def transcribe(
        self,
        audio: AudioInput,
        *,
        task: str = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
        max_seconds: float | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[TranscriptionOutput, None]:
        """Transcribe (or, with task 'translate', translate into English) an audio file's bytes,
        a path to one, or 16 kHz mono samples, from a speech engine; iterate the result for one
        `TranscriptionOutput` per 30-second window the engine decodes (the last `finished`).

        Raises here, before anything is sent: `UnsupportedTaskError` on a text engine,
        `InvalidPromptError` naming the field for a task, language or temperature the model
        cannot serve (translation from an English-only model, say). The file is decoded when
        iteration starts (on a worker thread) and its `AudioError` (empty, not audio, longer
        than `max_seconds`) raises from the first `__anext__()`. `language` None: detected
        from the first window; `temperature` 0 falls back to hotter decoding where a window
        fails Whisper's thresholds, as OpenAI's does. Leaving the iteration early aborts the
        request in the engine, which stops within the window it is decoding."""
        self._check_alive()
        self._check_task("transcribe")
        code = check_options(
            self.model_config, task=task, language=language, temperature=temperature
        )
        request = new_request(
            request_id=request_id,
            task=task,
            language=code,
            prompt=prompt,
            temperature=temperature,
            word_timestamps=word_timestamps,
            priority=priority,
        )
        if self._transcriptions.has_request(request.request_id):
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        return transcription_stream(
            self._transcriptions, self._post, self._check_alive, audio, request, max_seconds
        )
