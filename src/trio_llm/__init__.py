"""trio-llm: an OpenAI-compatible LLM server and a nursery-based engine client."""

from trio_llm.client import (
    ChatTemplateError,
    EngineClient,
    EngineDeadError,
    EngineRequestError,
    EngineStartError,
    EngineStats,
    InvalidPromptError,
    LoraError,
    LoraNotFoundError,
    LoraRequest,
    ModelConfig,
    PromptTooLongError,
    Router,
    UnsupportedTaskError,
    open_engine,
    open_router,
)
from trio_llm.config import DEFAULT_EMBEDDING_MODEL, DEFAULT_MODEL, EngineArgs
from trio_llm.constraint import Constraint, ConstraintKind
from trio_llm.llm import LLM
from trio_llm.outputs import (
    ClassificationOutput,
    ClassificationRequestOutput,
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
    ScoringOutput,
    ScoringRequestOutput,
    TranscriptionOutput,
    TranscriptionSegment,
    TranscriptionWord,
)
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError
from trio_llm.speech.audio import AudioError
from trio_llm.speech.models import DEFAULT_SPEECH_MODEL

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_MODEL",
    "DEFAULT_SPEECH_MODEL",
    "LLM",
    "AudioError",
    "ChatTemplateError",
    "ClassificationOutput",
    "ClassificationRequestOutput",
    "CompletionOutput",
    "Constraint",
    "ConstraintKind",
    "EmbeddingOutput",
    "EmbeddingRequestOutput",
    "EngineArgs",
    "EngineClient",
    "EngineDeadError",
    "EngineRequestError",
    "EngineStartError",
    "EngineStats",
    "InvalidPromptError",
    "Logprob",
    "LoraError",
    "LoraNotFoundError",
    "LoraRequest",
    "ModelConfig",
    "PositionLogprobs",
    "PromptTooLongError",
    "RequestMetrics",
    "RequestOutput",
    "RequestOutputKind",
    "Router",
    "SamplingParams",
    "SamplingParamsError",
    "ScoringOutput",
    "ScoringRequestOutput",
    "TranscriptionOutput",
    "TranscriptionSegment",
    "TranscriptionWord",
    "UnsupportedTaskError",
    "__version__",
    "open_engine",
    "open_router",
]
