"""trio-llm: an OpenAI-compatible LLM server and a nursery-based engine client."""

from trio_llm.config import DEFAULT_MODEL, EngineArgs
from trio_llm.outputs import CompletionOutput, Logprob, RequestOutput
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "CompletionOutput",
    "EngineArgs",
    "Logprob",
    "RequestOutput",
    "RequestOutputKind",
    "SamplingParams",
    "__version__",
]
