"""The nursery-based engine client (the frontend): `open_engine` yields an `EngineClient`."""

from trio_llm.client.engine_client import EngineClient, EngineStats, ModelConfig, open_engine
from trio_llm.client.errors import (
    ChatTemplateError,
    EngineDeadError,
    EngineRequestError,
    EngineStartError,
    InvalidPromptError,
    PromptTooLongError,
    UnsupportedTaskError,
)

__all__ = [
    "ChatTemplateError",
    "EngineClient",
    "EngineDeadError",
    "EngineRequestError",
    "EngineStartError",
    "EngineStats",
    "InvalidPromptError",
    "ModelConfig",
    "PromptTooLongError",
    "UnsupportedTaskError",
    "open_engine",
]
