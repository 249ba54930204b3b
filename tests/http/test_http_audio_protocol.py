"""The pure pieces of /v1/audio/*: the plan's refusals, the response formats, the stream's
events, with plain values (no server, no model)."""

from __future__ import annotations

import json

import pytest

from trio_llm.http.audio.build import TranscriptStream, response_body, srt, timestamp, vtt
from trio_llm.http.audio.plan import plan_audio
from trio_llm.http.audio.protocol import AudioForm
from trio_llm.http.errors import ProtocolError
from trio_llm.ipc.messages import SpeechSegment, SpeechWord
from trio_llm.outputs import TranscriptionOutput


def _segment(i: int, start: float, end: float, text: str, words: bool = False) -> SpeechSegment:
    return SpeechSegment(
        id=i,
        seek=0,
        start=start,
        end=end,
        text=text,
        tokens=[1, 2],
        temperature=0.0,
        avg_logprob=-0.2,
        compression_ratio=1.1,
        no_speech_prob=0.01,
        words=[SpeechWord(w, start, end, 0.9) for w in text.split()] if words else None,
    )


def _output(segments: list[SpeechSegment], *, finished: bool = True) -> TranscriptionOutput:
    return TranscriptionOutput(
        request_id="r",
        new_segments=segments,
        segments=segments,
        task="transcribe",
        language="en",
        language_probability=1.0,
        duration=3725.25,
        position=3725.25,
        finished=finished,
    )


def test_timestamps_are_written_as_subrip_and_webvtt_want_them() -> None:
    assert timestamp(3725.2504, ",") == "01:02:05,250"
    assert timestamp(0.0, ".") == "00:00:00.000"
    segments = [_segment(1, 0.0, 2.5, " Hello there."), _segment(2, 3661.0, 3662.75, " Bye.")]
    assert srt(segments) == (
        "1\n00:00:00,000 --> 00:00:02,500\nHello there.\n\n"
        "2\n01:01:01,000 --> 01:01:02,750\nBye.\n\n"
    )
    assert vtt(segments).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:02.500\nHello there.\n\n")


def test_verbose_json_has_segments_words_and_the_language_by_name() -> None:
    form = AudioForm(response_format="verbose_json", timestamp_granularities=["word"])
    plan = plan_audio(form, "transcribe", ["response_format", "timestamp_granularities"])
    assert (plan.words, plan.segments) == (True, False)
    body, mimetype = response_body(plan, _output([_segment(1, 0.0, 1.0, " Hi you.", True)]))
    got = json.loads(body)
    assert mimetype == "application/json"
    assert got["language"] == "english" and got["text"] == "Hi you." and "segments" not in got
    assert [w["word"] for w in got["words"]] == ["Hi", "you."]
    assert got["usage"] == {"type": "duration", "seconds": 3725.25}


def test_stream_deltas_concatenate_to_the_done_text() -> None:
    builder = TranscriptStream()
    events = builder.feed(_output([_segment(1, 0, 1, " One.")], finished=False))
    events += builder.feed(_output([], finished=False))  # a silent window: no event
    events += builder.feed(_output([_segment(2, 1, 2, " Two."), _segment(3, 2, 3, " Three")]))
    events += builder.end()
    deltas = [e.delta for e in events[:-1]]
    assert deltas == ["One.", " Two. Three"]
    assert events[-1].text == "".join(deltas) == "One. Two. Three"


@pytest.mark.parametrize(
    ("form", "fields", "param"),
    [
        (AudioForm(timestamp_granularities=["word"]), [], "timestamp_granularities"),
        (AudioForm(stream=True, response_format="srt"), [], "stream"),
        (AudioForm(language="klingon"), [], "language"),
        (AudioForm(), ["include"], "include"),
        (AudioForm(), ["chunking_strategy"], "chunking_strategy"),
    ],
)
def test_a_form_the_server_cannot_serve_is_refused_naming_the_field(
    form: AudioForm, fields: list[str], param: str
) -> None:
    with pytest.raises(ProtocolError) as caught:
        plan_audio(form, "transcribe", fields)
    assert (caught.value.status, caught.value.param) == (400, param)
