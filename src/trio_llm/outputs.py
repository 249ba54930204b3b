"""What `EngineClient.generate` yields, the user-facing view of a request's progress, what
`EngineClient.embed`, `score` and `classify` return (vLLM's names and fields), and what
`EngineClient.transcribe` yields."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# What crosses the ring is what the caller gets: public names for the engine's structs.
from trio_llm.ipc.messages import SpeechSegment as TranscriptionSegment
from trio_llm.ipc.messages import SpeechWord as TranscriptionWord  # noqa: F401


@dataclass(slots=True)
class Logprob:
    """One candidate token at one position."""

    token_id: int
    logprob: float
    rank: int
    decoded: str
    """The token's text, with bytes that are not whole UTF-8 characters left as `bytes:\\xNN`."""


@dataclass(slots=True)
class PositionLogprobs:
    """The sampled token at one position and the top alternatives there."""

    chosen: Logprob
    top: list[Logprob]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    """Choice index (0..n-1)."""
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[PositionLogprobs] | None = None
    finish_reason: str | None = None
    """'stop', 'length', 'abort' or 'error'; None while running."""
    stop_reason: int | str | None = None
    """The stop string or stop token id that ended the output."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestMetrics:
    arrival_time: float
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    num_cached_tokens: int = 0


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics
    prompt_logprobs: list[PositionLogprobs | None] | None = None
    num_cached_tokens: int = 0


@dataclass(slots=True)
class EmbeddingOutput:
    data: np.ndarray
    """The embedding, float32, as the engine pooled it (normalised when the model says so)."""

    @property
    def embedding(self) -> list[float]:
        return self.data.tolist()

    @property
    def hidden_size(self) -> int:
        return int(self.data.shape[0])


@dataclass(slots=True)
class EmbeddingRequestOutput:
    """What `EngineClient.embed` returns: one input's embedding."""

    request_id: str
    prompt_token_ids: list[int]
    """The input as the model saw it (after any truncation)."""
    outputs: EmbeddingOutput
    finished: bool = True


@dataclass(slots=True)
class TranscriptionOutput:
    """A transcription's progress, one per window the engine decoded: the segments that window
    added, and every segment so far. The last has `finished` set."""

    request_id: str
    new_segments: list[TranscriptionSegment]
    """What this window added (possibly nothing: a silent window)."""
    segments: list[TranscriptionSegment]
    """Every segment so far, in order."""
    task: str
    """transcribe | translate."""
    language: str
    """The spoken language's code (given, or detected from the first window)."""
    language_probability: float
    duration: float
    """Seconds of audio in the file."""
    position: float
    """Seconds of it transcribed so far."""
    finished: bool = False

    @property
    def delta(self) -> str:
        """The text this window added."""
        return "".join(s.text for s in self.new_segments)

    @property
    def text(self) -> str:
        """The whole text so far, as OpenAI's `text` gives it (no leading space)."""
        return "".join(s.text for s in self.segments).strip()


@dataclass(slots=True)
class ScoringOutput:
    score: float
    """The pair's score: a cross-encoder's activated logit, or an embedding model's cosine."""


@dataclass(slots=True)
class ScoringRequestOutput:
    """What `EngineClient.score` returns for one pair of texts."""

    request_id: str
    prompt_token_ids: list[int]
    """What the model saw for the pair: the pair's encoding for a cross-encoder, both texts'
    token ids one after the other for an embedding model (vLLM's)."""
    outputs: ScoringOutput
    finished: bool = True


@dataclass(slots=True)
class ClassificationOutput:
    probs: list[float]
    """One per label, in the model's label order: the softmax over several labels, a
    cross-encoder's activated score for one."""
    label: str
    """The most probable label's name (`id2label`)."""

    @property
    def num_classes(self) -> int:
        return len(self.probs)


@dataclass(slots=True)
class ClassificationRequestOutput:
    """What `EngineClient.classify` returns for one input."""

    request_id: str
    prompt_token_ids: list[int]
    outputs: ClassificationOutput
    finished: bool = True
