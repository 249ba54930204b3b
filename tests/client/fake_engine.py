"""An engine played by the test over real shared-memory rings, for the client's own behaviour:
the test decides what the engine publishes and when its process exits, to the instant."""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio

from trio_llm.client.engine_client import EngineClient
from trio_llm.config import EngineArgs
from trio_llm.ipc import RingSender, ShmRing, decode_frontend_message, encode
from trio_llm.ipc.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineReady,
    SchedulerStats,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class FakeProcess:
    """The process handle the client watches: it exits when the test says so."""

    pid = 0

    def __init__(self) -> None:
        self.returncode: int | None = None
        self._exited = anyio.Event()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def exit(self, code: int) -> None:
        self.returncode = code
        self._exited.set()


@dataclass
class FakeEngine:
    process: FakeProcess
    outputs: RingSender
    requests: ShmRing
    received: list[EngineCoreRequest] = field(default_factory=list)

    async def next_request(self) -> EngineCoreRequest:
        receiver = self.requests.receiver()
        with anyio.fail_after(5):
            while True:
                try:
                    message = decode_frontend_message(receiver.receive_nowait())
                except anyio.WouldBlock:
                    await anyio.sleep(0.001)
                    continue
                if isinstance(message, EngineCoreRequest):
                    self.received.append(message)
                    return message

    def publish(self, *outputs: EngineCoreOutput) -> None:
        self.outputs.send(
            encode(EngineCoreOutputs(outputs=list(outputs), timestamp=0.0, stats=SchedulerStats()))
        )

    def die(self, *, code: int = -signal.SIGKILL) -> None:
        """The process ends: its end of the output ring closes and its handle reports it."""
        self.outputs.close()
        self.process.exit(code)


@asynccontextmanager
async def client_with_fake_engine(
    tokenizer: PreTrainedTokenizerBase,
) -> AsyncIterator[tuple[EngineClient, FakeEngine]]:
    with ShmRing.create(1 << 16) as request_ring, ShmRing.create(1 << 16) as output_ring:
        ready = EngineReady(
            model="fake",
            max_model_len=512,
            vocab_size=len(tokenizer),
            eos_token_ids=[tokenizer.eos_token_id],
            dtype="float32",
            device="cpu",
            block_size=16,
            num_blocks=32,
            kv_capacity_tokens=512,
            kv_cache_bytes=1 << 20,
        )
        process = FakeProcess()
        sender = request_ring.async_sender()
        client = EngineClient(
            EngineArgs(model="fake"),
            process,  # type: ignore[arg-type]
            sender,
            output_ring.async_receiver(),
            tokenizer,
            ready,
            max_message_bytes=sender.sync.max_message_size,
        )
        engine = FakeEngine(process, output_ring.sender(), request_ring)
        async with client.running():
            yield client, engine
