"""One owner for the tokenizer: no instance is ever inside two threads at once, whatever mix of
big inputs (tokenized on a worker thread) and streams (detokenized on the event loop) runs."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import anyio
import pytest

from trio_llm import RequestOutputKind, SamplingParams
from trio_llm.client.confined_tokenizer import INLINE_MAX_COST

from .fake_engine import client_with_fake_engine
from .tokenizer_probe import watch_tokenizer_use

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

pytestmark = pytest.mark.anyio

BIG = "many words " * (INLINE_MAX_COST // 8)
HUGE_IDS = list(range(1000, 1000 + INLINE_MAX_COST))


async def test_big_inputs_and_streams_never_share_a_tokenizer_instance(
    tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    with watch_tokenizer_use(monkeypatch, type(tokenizer)) as use:
        async with client_with_fake_engine(tokenizer) as (client, _):
            big_work_done = anyio.Event()

            async def big_work() -> None:
                """Everything that is too big for the event loop, one after another."""
                for i in range(3):
                    assert len(await client.encode(BIG + str(i))) > INLINE_MAX_COST // 8
                    await client.apply_chat_template([{"role": "user", "content": BIG}])
                    assert await client.decode(HUGE_IDS)
                    assert len(await client.vocab_tokens(HUGE_IDS)) == len(HUGE_IDS)
                big_work_done.set()

            async def small_work() -> None:
                """Meanwhile, on the loop: small inputs, and streams being set up."""
                params = SamplingParams(max_tokens=4, output_kind=RequestOutputKind.DELTA)
                while not big_work_done.is_set():
                    assert await client.encode("a short question") == tokenizer.encode(
                        "a short question"
                    )
                    assert await client.decode([1000, 1001]) == tokenizer.decode([1000, 1001])
                    with anyio.move_on_after(0.005):
                        async for _ in client.generate(list(range(2000, 2030)), params):
                            pass  # the test's engine never answers; leaving aborts

            async with anyio.create_task_group() as tg:
                tg.start_soon(big_work)
                tg.start_soon(small_work)

    assert use.overlaps == []
    on_loop = [i for i, threads in use.threads.items() if loop_thread in threads]
    off_loop = [i for i, threads in use.threads.items() if loop_thread not in threads]
    # One instance serves the loop, and only the loop; the big work ran on another.
    assert len(on_loop) == 1 and use.threads[on_loop[0]] == {loop_thread}
    assert off_loop, "the big inputs were handled on the event loop"
