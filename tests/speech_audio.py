"""Speech for the speech-to-text tests, made on the spot: espeak-ng (Debian's package, installed
by scripts/bootstrap.sh) speaks known sentences, PyAV encodes them into the containers a client
may send, and `word_error_rate` scores a transcription against what was said.

The sentences are plain words (no numbers, no names) that espeak-ng says clearly enough for
tiny.en; `SENTENCES` is what the WER test reads, `long_speech` strings them into minutes of
audio with pauses between, so each 30-second window holds different words (Whisper's
thresholds flag a window that repeats itself word for word as a decoding failure).
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
from functools import cache

import numpy as np
import pytest

SENTENCES = (
    "The meeting has been moved to three o'clock on Thursday afternoon.",
    "She opened the window and listened to the birds in the garden.",
    "The library is closed on Sundays but open late on Fridays.",
    "He bought a new bicycle and rode it around the park.",
    "The children played football until it was too dark to see.",
    "We should finish the report before the end of the week.",
    "Please remember to buy milk and bread on your way home.",
    "The weather today is sunny with a light breeze from the west.",
)

RATE = 16_000

requires_espeak = pytest.mark.skipif(
    shutil.which("espeak-ng") is None,
    reason="espeak-ng is not installed (scripts/bootstrap.sh installs it with apt-get)",
)


@cache
def speak(text: str, *, voice: str = "en", words_per_minute: int = 150) -> bytes:
    """A WAV file of espeak-ng saying `text` (22.05 kHz mono, as espeak-ng writes it)."""
    return subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "--stdout", text],
        check=True,
        capture_output=True,
        timeout=60,
    ).stdout


def samples(wav: bytes) -> np.ndarray:
    """A WAV file's samples at 16 kHz mono int16 (decoded as the server decodes)."""
    from trio_llm.speech.audio import decode_audio

    return decode_audio(wav)


def long_speech(seconds: float) -> np.ndarray:
    """At least `seconds` of speech at 16 kHz: the sentences in turn, half a second of silence
    after each, cycling with a different pause once all are said."""
    parts: list[np.ndarray] = []
    total, round_ = 0, 0
    while total < seconds * RATE:
        for text in SENTENCES:
            speech = samples(speak(text))
            pause = np.zeros(RATE // 2 + round_ * RATE // 10, dtype=np.int16)
            parts += [speech, pause]
            total += speech.size + pause.size
        round_ += 1
    return np.concatenate(parts)


def encode(pcm: np.ndarray, container: str, codec: str, rate: int = RATE) -> bytes:
    """16 kHz mono int16 samples as a file of `container` with `codec` (PyAV's encoders)."""
    import av

    out_buffer = io.BytesIO()
    with av.open(out_buffer, "w", format=container) as out:
        stream = out.add_stream(codec, rate=rate)
        stream.layout = "mono"
        frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        resampler = av.AudioResampler(
            format=stream.codec_context.format.name, layout="mono", rate=rate
        )
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(resampled):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return out_buffer.getvalue()


def wav(pcm: np.ndarray) -> bytes:
    return encode(pcm, "wav", "pcm_s16le")


def words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower().replace("-", " ")).split()


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's words (case and punctuation ignored)."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1] / max(1, len(ref))
