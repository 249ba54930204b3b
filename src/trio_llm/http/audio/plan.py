"""An audio request's form, validated into what the engine is asked and how the answer is
shaped.

Owns every check that needs neither the file nor the model: the fields this server does not
build (a 400 naming each), timestamp granularities only with verbose_json (as OpenAI requires),
a stream only as json or text (OpenAI's transcript.text events carry text), a language Whisper
knows. What needs the model (does it know the language, can it translate) is the client's
`check_options`; what needs the file is the decoder's. Invariant: nothing here touches Quart or
the engine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from trio_llm.http.audio.protocol import UNBUILT_FIELDS, AudioForm
from trio_llm.http.errors import bad_request, not_supported
from trio_llm.speech.languages import language_code


@dataclass(frozen=True, slots=True)
class AudioPlan:
    task: str
    """transcribe | translate."""
    language: str | None
    prompt: str | None
    temperature: float
    response_format: str
    segments: bool
    """verbose_json lists the segments."""
    words: bool
    """verbose_json lists the words (the engine aligns them: costs a little more)."""
    stream: bool


def plan_audio(form: AudioForm, task: str, field_names: Iterable[str]) -> AudioPlan:
    """`field_names`: every field the form held, so the unbuilt ones are refused by name."""
    for name in field_names:
        if name in UNBUILT_FIELDS:
            raise not_supported(name, UNBUILT_FIELDS[name])
    granularities = form.timestamp_granularities
    if granularities is not None and form.response_format != "verbose_json":
        raise bad_request(
            "timestamp_granularities: response_format must be verbose_json to get timestamps",
            param="timestamp_granularities",
        )
    if form.stream and form.response_format not in ("json", "text"):
        raise bad_request(
            f"stream: a stream carries transcript.text events; response_format must be json or "
            f"text, not {form.response_format}",
            param="stream",
        )
    language = None
    if form.language is not None and form.language.strip():
        language = language_code(form.language)
        if language is None:
            raise bad_request(
                f"language: unknown language {form.language!r}; give an ISO-639-1 code such "
                "as 'en' or 'fr'",
                param="language",
            )
    kinds = set(granularities or ["segment"])
    return AudioPlan(
        task=task,
        language=language,
        prompt=form.prompt or None,
        temperature=form.temperature,
        response_format=form.response_format,
        segments="segment" in kinds,
        words="word" in kinds,
        stream=form.stream,
    )
