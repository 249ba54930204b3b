"""Speech to text from the library: audio decoding and its refusals, the embedded Whisper
models, `LLM.transcribe` and `EngineClient.transcribe` on a real speech engine process (tiny.en),
with espeak-ng speech."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import trio

from speech_audio import (
    SENTENCES,
    encode,
    long_speech,
    requires_espeak,
    samples,
    speak,
    wav,
    word_error_rate,
)
from trio_llm import LLM, AudioError, InvalidPromptError, SamplingParams, UnsupportedTaskError
from trio_llm.client import open_engine
from trio_llm.model_files import resolve_model
from trio_llm.speech.audio import decode_audio
from trio_llm.speech.languages import language_code, language_name
from trio_llm.speech.models import embedded_speech_model, is_whisper_directory

pytestmark = requires_espeak


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    return samples(speak(SENTENCES[0]))


# -- decoding -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "codec", "rate"),
    [
        ("wav", "pcm_s16le", 16_000),
        ("mp3", "libmp3lame", 16_000),
        ("flac", "flac", 16_000),
        ("ogg", "libopus", 48_000),
        ("webm", "libopus", 48_000),
        ("ipod", "aac", 16_000),  # .m4a
    ],
)
def test_every_container_a_client_may_send_decodes_to_the_same_speech(
    speech: np.ndarray, container: str, codec: str, rate: int
) -> None:
    decoded = decode_audio(encode(speech, container, codec, rate))
    assert abs(decoded.size - speech.size) <= 0.1 * speech.size
    assert decoded.dtype == np.int16 and np.abs(decoded).max() > 1000  # sound, not silence


def test_a_stereo_file_at_another_rate_is_resampled_to_16_khz_mono() -> None:
    import io

    import av

    seconds, rate = 2, 44_100
    tone = (np.sin(np.arange(seconds * rate) * 2 * np.pi * 440 / rate) * 8000).astype(np.int16)
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="wav") as out:
        stream = out.add_stream("pcm_s16le", rate=rate)
        stream.layout = "stereo"
        frame = av.AudioFrame.from_ndarray(
            np.repeat(tone, 2).reshape(1, -1), format="s16", layout="stereo"
        )
        frame.sample_rate = rate
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    assert abs(decode_audio(buffer.getvalue()).size - seconds * 16_000) < 200


def test_what_is_not_audio_is_refused_naming_the_file(speech: np.ndarray) -> None:
    cases = {
        b"": "empty",
        b"just some text, not a sound " * 40: "could not be decoded",
        speak(SENTENCES[0])[:44]: "no audio samples",  # a WAV header and nothing after it
    }
    for data, says in cases.items():
        with pytest.raises(AudioError, match=says) as caught:
            decode_audio(data)
        assert (caught.value.param, caught.value.status) == ("file", 400)
    with pytest.raises(AudioError, match="longer than the limit of 1 seconds") as caught:
        decode_audio(wav(speech), max_seconds=1)
    assert caught.value.status == 413


def test_languages_are_read_by_code_or_name() -> None:
    assert [language_code(x) for x in ("en", "French", " DE ", "klingon")] == [
        "en",
        "fr",
        "de",
        None,
    ]
    assert language_name("en") == "english"


# -- the embedded models --------------------------------------------------------------------


def test_the_embedded_speech_models_resolve_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = resolve_model("whisper-tiny.en")
    assert tiny.name == "whisper-tiny.en" and is_whisper_directory(tiny.path)
    # whisper-base ships as two packages; its parts are joined once into the cache.
    monkeypatch.setenv("TRIO_LLM_CACHE", str(tmp_path))
    joined = embedded_speech_model("Whisper-Base")
    assert joined is not None and is_whisper_directory(joined)
    assert joined.is_relative_to(tmp_path)
    made = (joined / "model.bin").stat().st_mtime_ns
    assert embedded_speech_model("whisper-base") == joined
    assert (joined / "model.bin").stat().st_mtime_ns == made  # not joined again
    assert embedded_speech_model("SmolLM2-135M-Instruct") is None


# -- LLM.transcribe -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llm() -> Iterator[LLM]:
    with LLM("whisper-tiny.en", num_threads=1) as model:
        yield model


def test_llm_transcribes_bytes_paths_and_samples_in_order(llm: LLM, tmp_path: Path) -> None:
    path = tmp_path / "said.wav"
    path.write_bytes(speak(SENTENCES[1]))
    floats = samples(speak(SENTENCES[2])).astype(np.float32) / 32768
    inputs = [encode(samples(speak(SENTENCES[0])), "mp3", "libmp3lame"), str(path), floats]
    outputs = llm.transcribe(inputs, word_timestamps=True)
    assert len(outputs) == 3
    for output, said in zip(outputs, SENTENCES[:3], strict=True):
        assert output.finished and output.language == "en" and output.task == "transcribe"
        assert word_error_rate(said, output.text) <= 0.25, output.text
        words = [w for s in output.segments for w in s.words or ()]
        assert words and all(w.start <= w.end <= output.duration + 0.5 for w in words)
    assert llm.model_config.task == "transcribe"


def test_options_the_model_cannot_serve_raise_before_anything_is_sent(
    llm: LLM, speech: np.ndarray
) -> None:
    for options, param in (
        ({"task": "translate"}, "model"),
        ({"language": "fr"}, "language"),
        ({"language": "klingon"}, "language"),
        ({"temperature": 1.5}, "temperature"),
    ):
        with pytest.raises(InvalidPromptError) as caught:
            llm.transcribe(speech, **options)  # type: ignore[arg-type]
        assert caught.value.param == param
    with pytest.raises(AudioError):
        llm.transcribe(b"not audio at all" * 10)
    with pytest.raises(UnsupportedTaskError, match="serves speech to text, not generation"):
        llm.generate("Hello", SamplingParams(max_tokens=2))
    # The engine never saw any of it, and still serves.
    [output] = llm.transcribe(speech)
    assert word_error_rate(SENTENCES[0], output.text) <= 0.25


# -- EngineClient.transcribe ----------------------------------------------------------------


async def test_outputs_come_window_by_window_and_leaving_early_aborts_the_request() -> None:
    long = long_speech(100)
    async with open_engine("whisper-tiny.en", num_threads=1) as client:
        seen = []
        async for output in client.transcribe(long):
            seen.append(output)
            if len(seen) == 2:
                break
        assert [o.finished for o in seen] == [False, False]
        assert 0 < seen[0].position < seen[1].position <= 60.0
        assert seen[1].segments[: len(seen[0].segments)] == seen[0].segments
        assert seen[0].duration == pytest.approx(long.size / 16_000)
        # The engine finishes at most the window it was decoding, then has nothing to do.
        steps = client.stats().num_steps
        deadline = time.monotonic() + 60
        while client.stats().num_running or client.stats().num_requests_in_flight:
            assert time.monotonic() < deadline
            await trio.sleep(0.05)
        assert client.stats().num_steps <= steps + 1
        # A request of the same id may be sent again: the first is forgotten.
        async for output in client.transcribe(samples(speak(SENTENCES[3])), request_id="again"):
            last = output
        assert last.finished and word_error_rate(SENTENCES[3], last.text) <= 0.25


async def test_a_file_path_is_read_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "said.wav"
    path.write_bytes(speak(SENTENCES[4]))
    async with open_engine("whisper-tiny.en", num_threads=1) as client:
        outputs = [o async for o in client.transcribe(os.fspath(path), language="en")]
    assert outputs[-1].finished and word_error_rate(SENTENCES[4], outputs[-1].text) <= 0.25
