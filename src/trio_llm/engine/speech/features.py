"""A file's log-mel features, computed in slices over engine steps instead of all at once.

What it owns: `MelFeatures`, the log-mel spectrogram of one transcription's audio as
faster-whisper's `FeatureExtractor` computes it, built `SLICE_FRAMES` frames at a time
(`compute_next`), and the windows the decoder reads (`window`).

Why in slices: the whole spectrogram of a 30-minute file takes seconds of CPU (0.7 s for five
minutes here); done inside one step it held every other transcription of the engine that long,
and the file's own abort (read between steps) too. A slice is a 30-second window's worth of
work, and a step computes only as many as fit its time for features (windows.py), so a step
stays short and aborts are read between steps.

Why ahead and not only as the windows are needed: Whisper floors every value at the file's
loudest minus 8 (log10 units), so a window's features depend on the whole file. The unfloored
values are computed slice by slice; the floor is applied to each window as it is read, once
every slice is in. Each frame sees exactly the samples, window function, FFT and filters the
library's whole-file call gives it, so a window's features are the library's (`test_speech`'s
equality of text with `WhisperModel.transcribe` holds).
"""

from __future__ import annotations

import numpy as np

SLICE_FRAMES = 3000
"""Frames computed per step: one 30-second window's (30 to 100 ms of CPU on this 2-core VM)."""


class MelFeatures:
    def __init__(self, extractor: object, audio: np.ndarray) -> None:
        """`extractor`: faster-whisper's `FeatureExtractor`; `audio`: float32 at 16 kHz."""
        self._fe = extractor
        fe = extractor
        n_fft, hop = fe.n_fft, fe.hop_length  # type: ignore[attr-defined]
        # The library's padding: 160 zeros after, then the STFT's reflected n_fft // 2 each side.
        waveform = np.pad(audio.astype(np.float32, copy=False), (0, 160))
        self._padded = np.pad(waveform, (n_fft // 2, n_fft // 2), mode="reflect")
        # The library drops the STFT's last frame.
        self.frames = (len(self._padded) - n_fft) // hop
        self._log = np.empty((fe.mel_filters.shape[0], self.frames), dtype=np.float32)  # type: ignore[attr-defined]
        self._window = np.hanning(n_fft + 1)[:-1].astype("float32")
        self.done = 0
        """Frames computed so far."""
        self._floor = np.float32(0.0)
        """The library's floor: the file's largest value less 8 (known once complete)."""

    @property
    def complete(self) -> bool:
        return self.done >= self.frames

    def compute_next(self, frames: int = SLICE_FRAMES) -> None:
        """Compute the next `frames` frames (fewer at the end); the floor once all are in."""
        fe = self._fe
        n_fft, hop = fe.n_fft, fe.hop_length  # type: ignore[attr-defined]
        start, end = self.done, min(self.frames, self.done + frames)
        if start < end:
            samples = self._padded[start * hop : (end - 1) * hop + n_fft]
            stft = fe.stft(  # type: ignore[attr-defined]
                samples, n_fft, hop, window=self._window, center=False, return_complex=True
            ).astype("complex64")
            magnitudes = np.abs(stft) ** 2
            mel = fe.mel_filters @ magnitudes  # type: ignore[attr-defined]
            self._log[:, start:end] = np.log10(np.clip(mel, a_min=1e-10, a_max=None))
            self.done = end
        if self.complete:
            self._floor = self._log.max() - 8.0
            self._padded = self._padded[:0]  # the samples are no longer needed

    def window(self, start: int, size: int) -> np.ndarray:
        """Frames [start, start + size) as the library's features have them (floored and
        scaled); only once `complete`."""
        assert self.complete
        part = self._log[:, start : start + size]
        return (np.maximum(part, self._floor) + 4.0) / 4.0
