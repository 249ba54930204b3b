"""Audio files to the 16 kHz mono samples Whisper hears, with PyAV (FFmpeg's libraries inside a
Python package: the decoder faster-whisper itself uses), never a shell command.

What it owns: decoding any container and codec FFmpeg reads (wav, mp3, flac, ogg, webm, m4a,
...) from bytes in memory, resampled to 16 kHz mono signed 16-bit, and the checks a caller's
file must pass: not empty, audio at all, not longer than the duration limit. Each failure is an
`AudioError` naming the request field (`file`) and the HTTP status that fits it, raised while
decoding, so an over-long file is refused as soon as the limit is passed, not after decoding
it all. Decoding is synchronous and slow for long files: callers run it on a worker thread.

Why int16: it is what the resampler gives (faster-whisper converts the same int16 to float32),
so nothing is lost, and it halves what crosses the ring to the engine.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from av.audio.frame import AudioFrame
    from av.container import InputContainer

SAMPLE_RATE = 16_000
"""Whisper's rate: every model hears 16 kHz mono."""


class AudioError(ValueError):
    """The file cannot be transcribed as given; `param` names the field, `status` the HTTP
    status (400, or 413 for a file over a limit)."""

    def __init__(self, message: str, *, param: str = "file", status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def decode_audio(data: bytes, *, max_seconds: float | None = None) -> np.ndarray:
    """The file's first audio stream as 16 kHz mono int16 samples. `AudioError` for an empty
    file, one FFmpeg cannot read as audio, one with no sound in it, or one longer than
    `max_seconds`."""
    if not data:
        raise AudioError("file is empty")
    import av

    max_samples = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    chunks: list[np.ndarray] = []
    total = 0
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            if not container.streams.audio:
                raise AudioError("file has no audio stream")
            resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
            for frame in _frames(container):
                for out in resampler.resample(frame):
                    chunk = out.to_ndarray().reshape(-1)
                    total += chunk.size
                    if max_samples is not None and total > max_samples:
                        raise too_long(max_seconds)
                    chunks.append(chunk)
            for out in resampler.resample(None):  # what the resampler still holds
                chunks.append(out.to_ndarray().reshape(-1))
    except AudioError:
        raise
    except (av.FFmpegError, ValueError, IndexError, EOFError) as error:
        raise AudioError(f"file could not be decoded as audio: {error}") from None
    samples = np.concatenate(chunks).astype(np.int16, copy=False) if chunks else _EMPTY
    if samples.size == 0:
        raise AudioError("file holds no audio samples")
    if max_samples is not None and samples.size > max_samples:
        raise too_long(max_seconds)
    return samples


_EMPTY = np.zeros(0, dtype=np.int16)


def _frames(container: InputContainer) -> Iterator[AudioFrame]:
    """The audio frames, skipping the ones FFmpeg cannot decode (a damaged packet in an
    otherwise good file), as faster-whisper does."""
    import av

    for packet in container.demux(audio=0):
        try:
            yield from packet.decode()  # type: ignore[misc]
        except av.error.InvalidDataError:
            continue


def too_long(max_seconds: float | None) -> AudioError:
    return AudioError(
        f"file is longer than the limit of {max_seconds:g} seconds of audio (--max-audio-seconds)",
        status=413,
    )


def duration(samples: np.ndarray) -> float:
    """Seconds of audio in 16 kHz samples."""
    return samples.size / SAMPLE_RATE
