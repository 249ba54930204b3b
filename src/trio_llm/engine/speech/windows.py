"""Whisper, one 30-second window at a time, for several transcriptions at once.

What it owns: each transcription's progress through its audio (`Transcription`: the mel
features (features.py: slices over several steps, all before its first window), the seek
position, the tokens that condition the next window, the segment count),
and `WindowDecoder.step`, which advances every transcription it is given by exactly one window:
their windows are encoded in one batch, their languages detected from that batch where not
given, decoded in one batch per temperature (beam search at 0, sampling above), and only the
windows that fail Whisper's thresholds (too repetitive, too unlikely) are decoded again, hotter,
in a smaller batch. The rest is faster-whisper's own per-window logic (splitting the tokens at
timestamps, word timestamps by cross-attention alignment, the next seek, the prompt reset),
called through its methods so the text is the library's.

A transcription whose features are not all in yet gets more slices of them in a step (one,
then more while `FEATURES_SECONDS` last) instead of a window, so a step never holds the others
(nor the file's own abort) for a whole file's features: 30 minutes of audio took about 4 s of
CPU in one step.

Why not `WhisperModel.transcribe`: its segment generator decodes every window of a file on its
own (no batching across requests), and runs through silent windows without yielding, so the
engine could not stop a cancelled request within one window. Here a step is one window per
transcription, and the engine loop reads aborts between steps.

Invariant: `step` never raises for one transcription's data; a window that fails fails only
its own transcription (the caller catches per call, so a batch that fails is retried one by
one).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from trio_llm.engine.speech.features import MelFeatures
from trio_llm.ipc.messages import SpeechSegment, SpeechWord

if TYPE_CHECKING:
    import ctranslate2
    from faster_whisper import WhisperModel
    from faster_whisper.tokenizer import Tokenizer

BEAM_SIZE = 5
BEST_OF = 5
"""Candidates sampled at a temperature above 0 (faster-whisper's defaults, as for beam size)."""
COMPRESSION_RATIO_THRESHOLD = 2.4
LOG_PROB_THRESHOLD = -1.0
NO_SPEECH_THRESHOLD = 0.6
PROMPT_RESET_ON_TEMPERATURE = 0.5
MAX_INITIAL_TIMESTAMP = 1.0
PREPEND_PUNCTUATIONS = "\"'“¿([{-"
APPEND_PUNCTUATIONS = "\"'.。,，!！?？:：”)]}、"
FEATURES_SECONDS = 0.1
"""A step's time for computing features (past one slice each): how much a long file's
features may lengthen a step, and so delay the others' windows and its own abort."""


def temperatures(first: float) -> tuple[float, ...]:
    """Whisper's fallback ladder from `first`: 0, 0.2, ... 1.0 for 0 (OpenAI's default)."""
    steps = int((1.0 - first) / 0.2 + 1e-6) if first < 1.0 else 0
    return tuple(round(first + 0.2 * i, 6) for i in range(steps + 1))


@dataclass(eq=False)
class Transcription:
    """One request's audio and how far it has got."""

    request_id: str
    audio: np.ndarray
    """float32 samples at 16 kHz."""
    task: str = "transcribe"
    language: str | None = None
    prompt: str | None = None
    temperatures: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
    word_timestamps: bool = False
    priority: int = 0
    arrival_time: float = 0.0
    # -- progress ----------------------------------------------------------------------
    features: MelFeatures | None = None
    """Built a slice per step; windows are decoded once it is complete."""
    content_frames: int = 0
    seek: int = 0
    tokenizer: Tokenizer | None = None
    language_probability: float = 1.0
    all_tokens: list[int] = field(default_factory=list)
    prompt_reset_since: int = 0
    last_speech_timestamp: float = 0.0
    segments_sent: int = 0

    @property
    def finished(self) -> bool:
        return (
            self.features is not None
            and self.features.complete
            and self.seek >= self.content_frames
        )


@dataclass(slots=True)
class WindowResult:
    """What one step did for one transcription."""

    transcription: Transcription
    segments: list[SpeechSegment]
    position: float
    """Seconds of audio transcribed so far."""


@dataclass(slots=True)
class _Decoded:
    result: Any  # ctranslate2.models.WhisperGenerationResult
    avg_logprob: float
    temperature: float
    compression_ratio: float

    def needs_fallback(self) -> bool:
        if self.result.no_speech_prob > NO_SPEECH_THRESHOLD and self.avg_logprob < (
            LOG_PROB_THRESHOLD
        ):
            return False  # silence: no hotter decoding will find words in it
        return (
            self.compression_ratio > COMPRESSION_RATIO_THRESHOLD
            or self.avg_logprob < LOG_PROB_THRESHOLD
        )


class WindowDecoder:
    def __init__(self, model: WhisperModel) -> None:
        from faster_whisper.tokenizer import Tokenizer
        from faster_whisper.transcribe import get_suppressed_tokens

        self.model = model
        self.features = model.feature_extractor
        self.multilingual: bool = model.model.is_multilingual
        english = Tokenizer(model.hf_tokenizer, self.multilingual, task="transcribe", language="en")
        # The same ids for every language and task (the special tokens and the symbols).
        self.suppress_tokens = list(get_suppressed_tokens(english, [-1]))
        self.eot: int = english.eot
        self.max_initial_timestamp_index = round(MAX_INITIAL_TIMESTAMP / model.time_precision)
        self._on_cpu = model.model.device == "cpu"

    @property
    def languages(self) -> list[str]:
        return list(self.model.supported_languages)

    # -- one step ------------------------------------------------------------------------

    def step(self, batch: Sequence[Transcription]) -> list[WindowResult]:
        """Advance each transcription by one window, or by one slice of its features while
        they are not all in (a finished one is left as it is); only those that advanced by a
        window have a result."""
        deadline = time.perf_counter() + FEATURES_SECONDS
        for t in batch:
            if t.features is None:
                self._start(t)
            if not t.features.complete:  # type: ignore[union-attr]
                self._more_features(t, deadline)
        batch = [t for t in batch if t.features.complete and not t.finished]  # type: ignore[union-attr]
        if not batch:
            return []
        fe = self.features
        sizes = [min(fe.nb_max_frames, t.content_frames - t.seek) for t in batch]
        mels = np.stack(
            [
                _pad_or_trim(t.features.window(t.seek, size))  # type: ignore[union-attr]
                for t, size in zip(batch, sizes, strict=True)
            ]
        )
        encoded = self._encode(mels)
        self._detect_languages(batch, encoded, mels)
        prompts = [self._prompt(t) for t in batch]
        decoded = self._decode(batch, encoded, mels, prompts)
        return [
            self._advance(t, encoded, mels, i, size, decoded[i])
            for i, (t, size) in enumerate(zip(batch, sizes, strict=True))
        ]

    def _start(self, t: Transcription) -> None:
        from faster_whisper.tokenizer import Tokenizer

        t.features = MelFeatures(self.features, t.audio)
        t.audio = t.audio[:0]  # the features hold their own (padded) copy
        t.content_frames = t.features.frames - 1
        if not self.multilingual:
            t.language = "en"
        if t.language is not None:
            t.tokenizer = Tokenizer(
                self.model.hf_tokenizer, self.multilingual, task=t.task, language=t.language
            )
        if t.prompt and t.prompt.strip():
            ids = self.model.hf_tokenizer.encode(" " + t.prompt.strip(), add_special_tokens=False)
            t.all_tokens.extend(ids.ids)

    @staticmethod
    def _more_features(t: Transcription, deadline: float) -> None:
        """At least one more slice of `t`'s features, more while the step's time for features
        lasts (a file alone gets its features at full speed, in steps of about that long)."""
        assert t.features is not None
        t.features.compute_next()
        while not t.features.complete and time.perf_counter() < deadline:
            t.features.compute_next()

    def _encode(self, mels: np.ndarray) -> ctranslate2.StorageView:
        import ctranslate2

        return self.model.model.encode(
            ctranslate2.StorageView.from_array(np.ascontiguousarray(mels, dtype=np.float32))
        )

    def _take(
        self, encoded: ctranslate2.StorageView, mels: np.ndarray, rows: list[int]
    ) -> ctranslate2.StorageView:
        """The encoder output of some of the batch's windows: a view on a CPU, encoded again
        elsewhere (only for the few windows a fallback or an alignment needs)."""
        import ctranslate2

        if len(rows) == mels.shape[0]:
            return encoded
        if self._on_cpu:
            array = np.asarray(encoded)[rows]
            return ctranslate2.StorageView.from_array(np.ascontiguousarray(array))
        return self._encode(mels[rows])

    def _detect_languages(
        self, batch: Sequence[Transcription], encoded: ctranslate2.StorageView, mels: np.ndarray
    ) -> None:
        from faster_whisper.tokenizer import Tokenizer

        rows = [i for i, t in enumerate(batch) if t.tokenizer is None]
        if not rows:
            return
        found = self.model.model.detect_language(self._take(encoded, mels, rows))
        for i, candidates in zip(rows, found, strict=True):
            t = batch[i]
            token, probability = candidates[0]
            t.language, t.language_probability = token[2:-2], probability
            t.tokenizer = Tokenizer(
                self.model.hf_tokenizer, self.multilingual, task=t.task, language=t.language
            )

    def _prompt(self, t: Transcription) -> list[int]:
        assert t.tokenizer is not None
        return self.model.get_prompt(t.tokenizer, t.all_tokens[t.prompt_reset_since :])

    def _decode(
        self,
        batch: Sequence[Transcription],
        encoded: ctranslate2.StorageView,
        mels: np.ndarray,
        prompts: list[list[int]],
    ) -> list[_Decoded]:
        """Each window decoded at its first temperature, then the windows that fail the
        thresholds again at the next, in batches of one temperature each."""
        attempt = [0] * len(batch)
        tries: list[list[_Decoded]] = [[] for _ in batch]
        chosen: list[_Decoded | None] = [None] * len(batch)
        pending = list(range(len(batch)))
        while pending:
            groups: dict[float, list[int]] = defaultdict(list)
            for i in pending:
                groups[batch[i].temperatures[attempt[i]]].append(i)
            pending = []
            for temperature, rows in groups.items():
                results = self._generate(
                    self._take(encoded, mels, rows), [prompts[i] for i in rows], temperature
                )
                for i, result in zip(rows, results, strict=True):
                    tokenizer = batch[i].tokenizer
                    assert tokenizer is not None
                    decoded = _score(result, temperature, tokenizer)
                    tries[i].append(decoded)
                    if not decoded.needs_fallback():
                        chosen[i] = decoded
                    elif attempt[i] + 1 < len(batch[i].temperatures):
                        attempt[i] += 1
                        pending.append(i)
                    else:
                        chosen[i] = _best(tries[i], temperature)
        assert all(c is not None for c in chosen)
        return chosen  # type: ignore[return-value]

    def _generate(
        self, encoded: ctranslate2.StorageView, prompts: list[list[int]], temperature: float
    ) -> list[Any]:
        kwargs: dict[str, Any] = (
            {
                "beam_size": 1,
                "num_hypotheses": BEST_OF,
                "sampling_topk": 0,
                "sampling_temperature": temperature,
            }
            if temperature > 0
            else {"beam_size": BEAM_SIZE, "patience": 1.0}
        )
        return self.model.model.generate(
            encoded,
            prompts,
            length_penalty=1.0,
            max_length=self.model.max_length,
            return_scores=True,
            return_no_speech_prob=True,
            suppress_blank=True,
            suppress_tokens=self.suppress_tokens,
            max_initial_timestamp_index=self.max_initial_timestamp_index,
            **kwargs,
        )

    def _advance(
        self,
        t: Transcription,
        encoded: ctranslate2.StorageView,
        mels: np.ndarray,
        row: int,
        size: int,
        decoded: _Decoded,
    ) -> WindowResult:
        """faster-whisper's per-window bookkeeping: the segments, the words, the next seek."""
        from faster_whisper.utils import get_end

        model, fe = self.model, self.features
        tokenizer = t.tokenizer
        assert tokenizer is not None
        time_offset = t.seek * fe.time_per_frame
        result = decoded.result
        if (
            result.no_speech_prob > NO_SPEECH_THRESHOLD
            and not decoded.avg_logprob > LOG_PROB_THRESHOLD
        ):
            t.seek += size  # silence
            return WindowResult(t, [], self._position(t))
        previous_seek = t.seek
        current, t.seek, single_timestamp_ending = model._split_segments_by_timestamps(
            tokenizer=tokenizer,
            tokens=result.sequences_ids[0],
            time_offset=time_offset,
            segment_size=size,
            segment_duration=size * fe.time_per_frame,
            seek=t.seek,
        )
        if t.word_timestamps:
            model.add_word_timestamps(
                [current],
                tokenizer,
                self._take(encoded, mels, [row]),
                size,
                PREPEND_PUNCTUATIONS,
                APPEND_PUNCTUATIONS,
                last_speech_timestamp=t.last_speech_timestamp,
            )
            last_word_end = get_end(current)
            if last_word_end is not None:
                if not single_timestamp_ending and last_word_end > time_offset:
                    t.seek = round(last_word_end * model.frames_per_second)
                t.last_speech_timestamp = last_word_end
        segments = []
        for segment in current:
            tokens = segment["tokens"]
            text = tokenizer.decode(tokens)
            if segment["start"] == segment["end"] or not text.strip():
                continue
            t.all_tokens.extend(tokens)
            t.segments_sent += 1
            words = segment.get("words") if t.word_timestamps else None
            segments.append(
                SpeechSegment(
                    id=t.segments_sent,
                    seek=previous_seek,
                    start=float(segment["start"]),
                    end=float(segment["end"]),
                    text=text,
                    tokens=list(tokens),
                    temperature=decoded.temperature,
                    avg_logprob=float(decoded.avg_logprob),
                    compression_ratio=float(decoded.compression_ratio),
                    no_speech_prob=float(result.no_speech_prob),
                    words=None
                    if words is None
                    else [
                        SpeechWord(
                            w["word"], float(w["start"]), float(w["end"]), float(w["probability"])
                        )
                        for w in words
                    ],
                )
            )
        if decoded.temperature > PROMPT_RESET_ON_TEMPERATURE:
            t.prompt_reset_since = len(t.all_tokens)
        return WindowResult(t, segments, self._position(t))

    def _position(self, t: Transcription) -> float:
        return float(min(t.seek, t.content_frames) * self.features.time_per_frame)


def _pad_or_trim(mel: np.ndarray) -> np.ndarray:
    from faster_whisper.audio import pad_or_trim

    return pad_or_trim(mel)


def _score(result: Any, temperature: float, tokenizer: Tokenizer) -> _Decoded:
    from faster_whisper.transcribe import get_compression_ratio

    tokens = result.sequences_ids[0]
    avg_logprob = result.scores[0] * len(tokens) / (len(tokens) + 1)
    text = tokenizer.decode(tokens).strip()
    return _Decoded(result, avg_logprob, temperature, get_compression_ratio(text))


def _best(tries: list[_Decoded], last_temperature: float) -> _Decoded:
    """Every temperature failed: the likeliest try among those not too repetitive (or among
    all), reported at the last temperature so the prompt resets, as Whisper does."""
    below = [d for d in tries if d.compression_ratio <= COMPRESSION_RATIO_THRESHOLD]
    best = max(below or tries, key=lambda d: d.avg_logprob)
    return _Decoded(best.result, best.avg_logprob, last_temperature, best.compression_ratio)
