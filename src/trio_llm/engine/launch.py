"""What the frontend hands the engine process on its stdin: the engine arguments and the two
rings' specs (the ring fds themselves arrive through `pass_fds`).

Importable without torch: the frontend builds this message without loading the engine.
"""

from __future__ import annotations

import msgspec

from trio_llm.config import EngineArgs
from trio_llm.ipc import RingSpec


class EngineLaunch(msgspec.Struct, kw_only=True):
    args: EngineArgs
    request_ring: RingSpec
    """Frontend -> engine: EngineCoreRequest, AbortRequests, Shutdown."""
    output_ring: RingSpec
    """Engine -> frontend: EngineReady or EngineFailure first, then EngineCoreOutputs."""
