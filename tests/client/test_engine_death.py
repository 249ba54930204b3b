"""An engine that dies right after publishing outputs: what it published still reaches its
requests, and only then do the requests still in flight fail.

The engine side is played by the test over real shared-memory rings, so that the outputs and
the death can be made to happen in the same instant: the process handle reports the exit the
moment the outputs are in the ring, before the client's output handler has woken up to read
them. That is the race a real engine loses when it publishes a request's last tokens and then
crashes or is killed.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import pytest

from trio_llm import EngineDeadError, RequestOutputKind, SamplingParams
from trio_llm.client.engine_client import EngineClient
from trio_llm.config import EngineArgs
from trio_llm.ipc import RingSender, ShmRing, decode_frontend_message, encode
from trio_llm.ipc.messages import (
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineFailure,
    EngineReady,
    SchedulerStats,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

pytestmark = pytest.mark.anyio

DELTA = SamplingParams(max_tokens=8, output_kind=RequestOutputKind.DELTA)


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
        async with client._serving():
            yield client, engine


def token_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


async def test_the_last_tokens_published_before_a_death_are_delivered(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    last = token_ids(tokenizer, " and that is all")
    async with client_with_fake_engine(tokenizer) as (client, engine):
        texts: list[str] = []
        reasons: list[str | None] = []

        async def consume() -> None:
            async for out in client.generate([1, 2, 3], DELTA, request_id="r"):
                texts.append(out.outputs[0].text)
                reasons.append(out.outputs[0].finish_reason)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            add = await engine.next_request()
            # The request's final output and the death, in the same instant.
            engine.publish(
                EngineCoreOutput(
                    request_id=add.request_id, new_token_ids=last, finish_reason="length"
                )
            )
            engine.die()
        assert "".join(texts) == " and that is all"
        assert reasons[-1] == "length"
        with anyio.fail_after(5):
            await client.wait_dead()
        with pytest.raises(EngineDeadError, match="SIGKILL"):
            client.generate([1, 2, 3], DELTA)


async def test_requests_still_running_fail_after_what_was_published(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    first = token_ids(tokenizer, " partial")
    async with client_with_fake_engine(tokenizer) as (client, engine):
        texts: list[str] = []
        errors: list[EngineDeadError] = []

        async def consume() -> None:
            try:
                async for out in client.generate([1, 2, 3], DELTA, request_id="r"):
                    texts.append(out.outputs[0].text)
            except EngineDeadError as error:
                errors.append(error)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            add = await engine.next_request()
            engine.publish(EngineCoreOutput(request_id=add.request_id, new_token_ids=first))
            engine.die()
        assert "".join(texts) == " partial"
        assert len(errors) == 1 and "SIGKILL" in str(errors[0])


async def test_the_engines_own_failure_message_wins_over_its_exit_status(
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    async with client_with_fake_engine(tokenizer) as (client, engine):
        errors: list[EngineDeadError] = []

        async def consume() -> None:
            try:
                async for _ in client.generate([1, 2, 3], DELTA, request_id="r"):
                    pass
            except EngineDeadError as error:
                errors.append(error)

        async with anyio.create_task_group() as tg:
            tg.start_soon(consume)
            await engine.next_request()
            engine.outputs.send(encode(EngineFailure(message="CUDA out of memory")))
            engine.die(code=1)
        assert len(errors) == 1
        assert "CUDA out of memory" in str(errors[0])
