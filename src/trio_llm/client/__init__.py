"""The nursery-based engine client (the frontend): `open_engine` yields an `EngineClient`;
`open_router` starts several engines (models, replicas) behind one `Router`."""

from trio_llm.client.engine_client import EngineClient, EngineStats, ModelConfig
from trio_llm.client.engine_group import open_router
from trio_llm.client.engine_process import open_engine
from trio_llm.client.errors import (
    ChatTemplateError,
    EngineDeadError,
    EngineRequestError,
    EngineStartError,
    InvalidPromptError,
    LoraError,
    LoraNotFoundError,
    ModelNotServedError,
    NoLiveReplicaError,
    PromptTooLongError,
    UnsupportedTaskError,
)
from trio_llm.client.lease import Lease
from trio_llm.client.lora import LoraRequest
from trio_llm.client.router import Router

__all__ = [
    "ChatTemplateError",
    "EngineClient",
    "EngineDeadError",
    "EngineRequestError",
    "EngineStartError",
    "EngineStats",
    "InvalidPromptError",
    "Lease",
    "LoraError",
    "LoraNotFoundError",
    "LoraRequest",
    "ModelConfig",
    "ModelNotServedError",
    "NoLiveReplicaError",
    "PromptTooLongError",
    "Router",
    "UnsupportedTaskError",
    "open_engine",
    "open_router",
]
