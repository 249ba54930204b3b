"""Two replicas of the tiny model behind one `Router` (`open_router`, real engine processes):
requests spread by load, an abort reaches the replica that holds the request, and a replica
killed with SIGKILL fails only its own requests while the other keeps serving. Also the
embedding model served beside a generative one: each refuses the other's task."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import trio

from trio_llm import (
    DEFAULT_EMBEDDING_MODEL,
    EngineArgs,
    EngineDeadError,
    EngineStartError,
    RequestOutputKind,
    Router,
    SamplingParams,
    UnsupportedTaskError,
    open_router,
)
from trio_llm.client import ModelNotServedError
from trio_llm.sampling_params import SamplingParamsError

LONG = SamplingParams(
    max_tokens=2000, ignore_eos=True, temperature=0, output_kind=RequestOutputKind.DELTA
)
"""Long enough to be running through every check of a test that cancels it: the tiny model
decodes about a token a millisecond on a fast VM, and 400 tokens were over before an abort's
effect could be seen there (the replica's other request had finished too). Within the tiny
model's 2,048 positions."""
pytestmark = pytest.mark.anyio

ENGINE = {"dtype": "float32", "kv_cache_memory": "16MiB", "num_threads": 1, "max_num_seqs": 8}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    """Trio only: the router is the client's AnyIO code, which test_engine_client runs on
    both backends; here the cost is two engine processes per backend."""
    return "trio"


@pytest.fixture(scope="module")
async def router(tiny_model_dir: Path, anyio_backend: str) -> AsyncIterator[Router]:
    args = EngineArgs(model=str(tiny_model_dir), served_model_name="tiny", **ENGINE)
    async with open_router(args, data_parallel_size=2) as r:
        yield r


async def wait_until(predicate) -> None:  # type: ignore[no-untyped-def]
    """Poll: what is awaited here (engine stats) changes in another process."""
    with trio.fail_after(30):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.02)


async def run_until_first(router: Router, request_id: str, outcome: dict[str, object]) -> None:
    """Generate until the stream ends; record how (finish reason or the error)."""
    try:
        async for out in router.generate([1, 2, 3, 4], LONG, request_id=request_id):
            if out.finished:
                outcome[request_id] = out.outputs[0].finish_reason
    except EngineDeadError as error:
        outcome[request_id] = error


async def test_requests_spread_by_load_and_aborts_reach_their_replica(router: Router) -> None:
    [model] = router.models
    a, b = model.replicas
    outcome: dict[str, object] = {}
    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(run_until_first, router, f"r{i}", outcome)
        await wait_until(lambda: len(router._holders) == 4)
        assert (a.load, b.load) == (2, 2)  # least loaded, ties round-robin
        holders = {f"r{i}": router.holder(f"r{i}") for i in range(4)}
        await wait_until(lambda: all(s.stats.num_running == 2 for s in router.stats()))
        # A fifth goes to whichever has fewer once one is aborted.
        victim = "r0"
        victim_replica = holders[victim]
        assert victim_replica is not None and victim_replica.client is not None
        await router.abort(victim)
        await wait_until(lambda: victim in outcome)
        assert outcome[victim] == "abort"
        await wait_until(lambda: victim_replica.client.stats().num_running == 1)  # type: ignore[union-attr]
        other = b if victim_replica is a else a
        assert other.client is not None and other.client.stats().num_running == 2
        nursery.start_soon(run_until_first, router, "r4", outcome)
        await wait_until(lambda: router.holder("r4") is not None)
        assert router.holder("r4") is victim_replica
        nursery.cancel_scope.cancel()
    await wait_until(lambda: a.load == b.load == 0 and not router._holders)
    for s in router.stats():
        assert s.stats is not None
        await wait_until(lambda s=s: router.stats()[s.replica].stats.num_free_blocks  # type: ignore[union-attr]
                         == s.stats.num_total_blocks)  # fmt: skip


async def test_chat_and_embedding_models_behind_one_router(tiny_model_dir: Path) -> None:
    chat = EngineArgs(model=str(tiny_model_dir), served_model_name="tiny", **ENGINE)
    embed = EngineArgs(model=DEFAULT_EMBEDDING_MODEL, dtype="float32", num_threads=1)
    async with open_router(chat, embed) as router:
        assert router.names() == ["tiny", DEFAULT_EMBEDDING_MODEL]
        out = await router.embed("hello world", model=DEFAULT_EMBEDDING_MODEL)
        assert out.outputs.hidden_size == 384
        assert np.isclose(np.linalg.norm(out.outputs.data), 1.0, atol=1e-5)
        with pytest.raises(UnsupportedTaskError, match="is generative"):
            await router.embed("hello", model="tiny")
        with pytest.raises(UnsupportedTaskError, match="serves embeddings"):
            router.generate("hello", SamplingParams(), model=DEFAULT_EMBEDDING_MODEL)
        with pytest.raises(ModelNotServedError, match="`tiny`, `all-MiniLM-L6-v2`"):
            router.model("gpt-4")
        assert all(r.load == 0 for _, r in router.replicas())


async def test_one_model_that_fails_fails_the_start_with_its_own_error(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with pytest.raises(EngineStartError, match=r"no-such-model\[0\]: .*not found"):
        async with open_router(str(tiny_model_dir), str(tmp_path / "no-such-model"), **ENGINE):
            pass


async def finish(router: Router, prompt: list[int], params: SamplingParams) -> str | None:
    """Run a request to its end on the router; the finish reason."""
    reason = None
    async for out in router.generate(prompt, params):
        reason = out.outputs[0].finish_reason
    return reason


async def test_a_conversation_goes_back_to_the_replica_that_holds_its_prefix(
    router: Router,
) -> None:
    [model] = router.models
    short = SamplingParams(max_tokens=2, ignore_eos=True, temperature=0)
    turn1 = list(range(100, 180))  # five blocks of 16
    hits = {r.index: r.client.stats().prefix_cache_hits for r in model.replicas}  # type: ignore[union-attr]
    lease = router.lease(model, 1, prompt=turn1)
    home = lease.replica
    lease.release()
    await finish(router, turn1, short)
    # An unrelated prompt takes the least loaded (the other, in round-robin order among
    # equals); the next turn of the conversation goes back to where its history is cached.
    unrelated = router.lease(model, 1, prompt=list(range(300, 380)))
    assert unrelated.replica is not home
    unrelated.release()
    turn2 = [*turn1, 7, 8, 9, *range(200, 230)]
    lease = router.lease(model, 1, prompt=turn2)
    assert lease.replica is home
    lease.release()
    await finish(router, turn2, short)
    await wait_until(
        lambda: home.client.stats().prefix_cache_hits >= hits[home.index] + 64  # type: ignore[union-attr]
    )


async def test_least_loaded_wins_over_a_cached_prefix_when_the_load_is_too_uneven(
    router: Router,
) -> None:
    [model] = router.models
    prompt = list(range(400, 480))
    home = router.lease(model, 1, prompt=prompt)
    other = next(r for r in model.replicas if r is not home.replica)
    home.release()
    busy = router.lease(model, 100, prompt=prompt)  # its prefix holder, now far too loaded
    assert busy.replica is home.replica
    try:
        chosen = router.lease(model, 1, prompt=prompt)
        chosen.release()
        assert chosen.replica is other
    finally:
        busy.release()


async def test_a_non_zero_priority_is_refused_unless_the_engine_schedules_by_priority(
    router: Router,
) -> None:
    with pytest.raises(SamplingParamsError, match="--scheduling-policy priority") as caught:
        router.generate([1, 2, 3], SamplingParams(max_tokens=2), priority=-2147483648)
    assert caught.value.param == "priority"
    [model] = router.models
    assert all(r.load == 0 for r in model.replicas)  # the refused request holds nothing


async def test_a_request_waiting_on_a_replica_that_dies_runs_on_another(
    tiny_model_dir: Path,
) -> None:
    args = EngineArgs(
        model=str(tiny_model_dir), served_model_name="tiny", **{**ENGINE, "max_num_seqs": 2}
    )
    async with open_router(args, data_parallel_size=2) as router:
        [model] = router.models
        a, b = model.replicas
        outcome: dict[str, object] = {}

        async def run(request_id: str, prompt: list[int], params: SamplingParams) -> None:
            try:
                async for out in router.generate(prompt, params, request_id=request_id):
                    if out.finished:
                        outcome[request_id] = out.outputs[0].finish_reason
            except EngineDeadError as error:
                outcome[request_id] = error

        long = SamplingParams(n=2, max_tokens=2000, ignore_eos=True, temperature=0)
        short = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "running", [1, 2, 3], long)  # fills one replica's 2 seats
            await wait_until(lambda: router.holder("running") is not None)
            busy = router.holder("running")
            assert busy is not None and busy.client is not None
            await wait_until(lambda: busy.client.stats().num_running == 2)  # type: ignore[union-attr]
            idle = b if busy is a else a
            idle.load += 1000  # steer the next request onto the busy replica, where it waits
            nursery.start_soon(run, "waiting", [4, 5, 6], short)
            await wait_until(lambda: router.holder("waiting") is busy)
            idle.load -= 1000
            await wait_until(lambda: busy.client.stats().num_waiting == 1)  # type: ignore[union-attr]
            os.kill(busy.client.pid, signal.SIGKILL)
        assert isinstance(outcome["running"], EngineDeadError)  # it had started: it fails
        assert outcome["waiting"] == "length"  # it had not: it ran on the other replica
        assert a.load == 0 and b.load == 0


async def test_a_killed_replica_fails_only_its_own_requests(router: Router) -> None:
    """Last in this module: it kills one of the module router's replicas for good."""
    [model] = router.models
    a, b = model.replicas
    outcome: dict[str, object] = {}
    short = SamplingParams(max_tokens=30, ignore_eos=True, temperature=0)
    async with trio.open_nursery() as nursery:
        for i in range(4):
            nursery.start_soon(run_until_first, router, f"k{i}", outcome)
        await wait_until(lambda: len(router._holders) == 4)
        on_a = [rid for rid in list(router._holders) if router.holder(rid) is a]
        assert a.client is not None
        await wait_until(lambda: a.client.stats().num_running == 2)  # type: ignore[union-attr]
        os.kill(a.client.pid, signal.SIGKILL)
        await wait_until(lambda: all(rid in outcome for rid in on_a))
        assert all(isinstance(outcome[rid], EngineDeadError) for rid in on_a)
        assert not a.is_alive and b.is_alive
        # New requests go to the survivor and finish.
        outputs = router.generate([5, 6, 7], short, request_id="after")
        assert router.holder("after") is b
        async for out in outputs:
            if out.finished:
                assert out.outputs[0].finish_reason == "length"
        nursery.cancel_scope.cancel()
    assert a.load == 0 and b.load == 0
