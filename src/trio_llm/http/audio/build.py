"""A finished transcription as each response format writes it, and a transcription's windows
as OpenAI's streamed transcript events.

Formats: json (`{"text"}`, plus the audio's seconds as usage for a transcription), text (the
text and a newline), srt and vtt (one cue per segment, `HH:MM:SS,mmm` and `HH:MM:SS.mmm`),
verbose_json (task, language by name, duration, text, segments and/or words). The stream's
deltas are the windows' texts, the first without its leading space, so they concatenate to the
done event's text exactly.

Invariant: nothing here touches Quart or the engine; everything is tested with plain values.
"""

from __future__ import annotations

from typing import Any

import msgspec

from trio_llm.http.audio.plan import AudioPlan
from trio_llm.http.audio.protocol import (
    DurationUsage,
    SegmentOut,
    Transcription,
    TranscriptionVerbose,
    TranscriptTextDelta,
    TranscriptTextDone,
    WordOut,
)
from trio_llm.http.errors import ProtocolError
from trio_llm.outputs import TranscriptionOutput, TranscriptionSegment
from trio_llm.speech.languages import language_name

MIMETYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt",
}


def response_body(plan: AudioPlan, output: TranscriptionOutput) -> tuple[bytes, str]:
    """The body and its mimetype (Quart adds the charset of text/* types itself)."""
    fmt = plan.response_format
    mimetype = MIMETYPES[fmt]
    if fmt == "json":
        body = msgspec.json.encode(Transcription(text=output.text, usage=_usage(plan, output)))
    elif fmt == "verbose_json":
        body = msgspec.json.encode(verbose(plan, output))
    elif fmt == "text":
        body = (output.text + "\n").encode()
    elif fmt == "srt":
        body = srt(output.segments).encode()
    else:
        body = vtt(output.segments).encode()
    return body, mimetype


def _usage(plan: AudioPlan, output: TranscriptionOutput) -> DurationUsage | None:
    """OpenAI bills a whisper transcription by the second and says so; a translation's answer
    is its text alone."""
    if plan.task != "transcribe":
        return None
    return DurationUsage(seconds=round(output.duration, 3))


def verbose(plan: AudioPlan, output: TranscriptionOutput) -> TranscriptionVerbose:
    segments = output.segments
    return TranscriptionVerbose(
        task=plan.task,
        language=language_name("en" if plan.task == "translate" else output.language),
        duration=round(output.duration, 3),
        text=output.text,
        segments=[_segment(s) for s in segments] if plan.segments else None,
        words=[
            WordOut(word=w.word, start=w.start, end=w.end) for s in segments for w in s.words or ()
        ]
        if plan.words
        else None,
        usage=_usage(plan, output),
    )


def _segment(s: TranscriptionSegment) -> SegmentOut:
    return SegmentOut(
        id=s.id,
        seek=s.seek,
        start=round(s.start, 3),
        end=round(s.end, 3),
        text=s.text,
        tokens=s.tokens,
        temperature=s.temperature,
        avg_logprob=s.avg_logprob,
        compression_ratio=s.compression_ratio,
        no_speech_prob=s.no_speech_prob,
    )


def timestamp(seconds: float, marker: str) -> str:
    """`HH:MM:SS<marker>mmm`, as SubRip (`,`) and WebVTT (`.`) write it."""
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{marker}{ms:03d}"


def srt(segments: list[TranscriptionSegment]) -> str:
    return "".join(
        f"{i}\n{timestamp(s.start, ',')} --> {timestamp(s.end, ',')}\n{s.text.strip()}\n\n"
        for i, s in enumerate(segments, 1)
    )


def vtt(segments: list[TranscriptionSegment]) -> str:
    cues = "".join(
        f"{timestamp(s.start, '.')} --> {timestamp(s.end, '.')}\n{s.text.strip()}\n\n"
        for s in segments
    )
    return "WEBVTT\n\n" + cues


class TranscriptStream:
    """The events of a streamed transcription: one delta per window that added text, then
    the done event with the whole text."""

    done = b""
    """Nothing closes a transcript stream after its done event (no `[DONE]`)."""

    def __init__(self) -> None:
        self._text: list[str] = []

    def begin(self) -> list[Any]:
        return []

    def feed(self, output: TranscriptionOutput) -> list[Any]:
        delta = output.delta
        if not self._text:
            delta = delta.lstrip()
        if not delta:
            return []
        self._text.append(delta)
        return [TranscriptTextDelta(delta=delta)]

    def end(self) -> list[Any]:
        return [TranscriptTextDone(text="".join(self._text))]

    def fail(self, error: ProtocolError) -> list[Any]:
        """What OpenAI's SDK raises as an APIError mid-stream: a data line with `error`."""
        return [error.to_dict()]
