"""The wire types of /v1/audio/transcriptions and /v1/audio/translations: the multipart form's
text fields (the file travels beside them), the JSON answers, and the stream's events.

Invariant: nothing here touches Quart or the engine. The form's field names are OpenAI's; a
list field arrives as repeated `name[]` parts (what the SDK sends) or `name` parts.
"""

from __future__ import annotations

from typing import Annotated, Literal

from msgspec import Meta, Struct

from trio_llm.http.wire import Int32, RequestId

ResponseFormat = Literal["json", "text", "srt", "verbose_json", "vtt"]


class AudioForm(Struct, kw_only=True):
    """The text fields of either endpoint's form (a translation's `language` is this server's
    extension: the spoken language, when the model should not detect it)."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None
    response_format: ResponseFormat = "json"
    temperature: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0
    timestamp_granularities: list[Literal["word", "segment"]] | None = None
    stream: bool = False
    # vLLM's extensions, same names and meaning.
    priority: Int32 = 0
    request_id: RequestId | None = None


UNBUILT_FIELDS = {
    "include": "include (token logprobs)",
    "chunking_strategy": "chunking_strategy (voice activity detection)",
    "known_speaker_names": "known_speaker_names (diarization)",
    "known_speaker_references": "known_speaker_references (diarization)",
    "keywords": "keywords",
    "languages": "languages",
}
"""Fields OpenAI's newer transcription models take and Whisper here does not: a 400 naming the
field rather than a transcription that ignores it."""


class DurationUsage(Struct, kw_only=True):
    type: str = "duration"
    seconds: float


class Transcription(Struct, kw_only=True, omit_defaults=True):
    """response_format json: the text (and, for a transcription, the seconds of audio)."""

    text: str
    usage: DurationUsage | None = None


class WordOut(Struct, kw_only=True):
    word: str
    start: float
    end: float


class SegmentOut(Struct, kw_only=True):
    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: list[int]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float


class TranscriptionVerbose(Struct, kw_only=True, omit_defaults=True):
    """response_format verbose_json: segments unless only word timestamps were asked for,
    words when they were."""

    task: str
    language: str
    """The language's English name, as OpenAI gives it ("english")."""
    duration: float
    text: str
    segments: list[SegmentOut] | None = None
    words: list[WordOut] | None = None
    usage: DurationUsage | None = None


class TranscriptTextDelta(Struct, kw_only=True, tag_field="type", tag="transcript.text.delta"):
    delta: str


class TranscriptTextDone(Struct, kw_only=True, tag_field="type", tag="transcript.text.done"):
    text: str


WIRE_TYPES: tuple[type[Struct], ...] = (
    AudioForm,
    Transcription,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
)
"""What /openapi.json shows."""
