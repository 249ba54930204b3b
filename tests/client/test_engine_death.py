"""An engine that dies right after publishing outputs: what it published still reaches its
requests, and only then do the requests still in flight fail.

The engine side is played by the test over real shared-memory rings, so that the outputs and
the death can be made to happen in the same instant: the process handle reports the exit the
moment the outputs are in the ring, before the client's output handler has woken up to read
them. That is the race a real engine loses when it publishes a request's last tokens and then
crashes or is killed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
import pytest

from trio_llm import EngineDeadError, RequestOutputKind, SamplingParams
from trio_llm.ipc import encode
from trio_llm.ipc.messages import EngineCoreOutput, EngineFailure

from .fake_engine import client_with_fake_engine

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

pytestmark = pytest.mark.anyio

DELTA = SamplingParams(max_tokens=8, output_kind=RequestOutputKind.DELTA)


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
