"""The engine as its own process, driven through the two rings the way the frontend drives it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest

from engine_dtype import ENGINE_DTYPE
from trio_llm.config import EngineArgs
from trio_llm.ipc import ShmRing
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineFailure,
    EngineLaunch,
    EngineLoading,
    EngineReady,
    Shutdown,
)
from trio_llm.sampling_params import SamplingParams

TIMEOUT = 60.0


@dataclass
class Engine:
    process: subprocess.Popen[bytes]
    requests: ShmRing
    outputs: ShmRing

    def send(self, msg: object) -> None:
        self.requests.sender().send(encode(msg), timeout=TIMEOUT)

    def receive(self) -> object:
        """The next message, past the start-up progress ones."""
        while True:
            msg = decode_engine_message(self.outputs.receiver().receive(timeout=TIMEOUT))
            if not isinstance(msg, EngineLoading):
                return msg


def launch(args: EngineArgs) -> Engine:
    requests, outputs = ShmRing.create(1 << 20), ShmRing.create(1 << 20)
    process = subprocess.Popen(
        [sys.executable, "-m", "trio_llm.engine"],
        stdin=subprocess.PIPE,
        pass_fds=(*requests.fds, *outputs.fds),
    )
    requests.watch_peer(process.pid)
    outputs.watch_peer(process.pid)
    assert process.stdin is not None
    process.stdin.write(
        encode(EngineLaunch(args=args, request_ring=requests.spec, output_ring=outputs.spec))
    )
    process.stdin.close()
    return Engine(process, requests, outputs)


@contextmanager
def running_engine(args: EngineArgs) -> Iterator[Engine]:
    engine = launch(args)
    try:
        yield engine
    finally:
        if engine.process.poll() is None:
            engine.process.kill()
        engine.process.wait(TIMEOUT)
        engine.requests.close()
        engine.outputs.close()


def tiny_args(model: Path) -> EngineArgs:
    return EngineArgs(model=str(model), kv_cache_memory="4MiB", num_threads=1, dtype=ENGINE_DTYPE)


def test_handshake_requests_an_idle_abort_and_a_clean_shutdown(tiny_model_dir: Path) -> None:
    with running_engine(tiny_args(tiny_model_dir)) as engine:
        ready = engine.receive()
        assert isinstance(ready, EngineReady)
        assert ready.pid == engine.process.pid
        assert ready.vocab_size == 49152 and ready.kv_capacity_tokens > 0

        params = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
        engine.send(
            EngineCoreRequest(
                request_id="r", prompt_token_ids=[500, 600, 700], sampling_params=params
            )
        )
        tokens: list[int] = []
        finish = None
        while finish is None:
            msg = engine.receive()
            assert isinstance(msg, EngineCoreOutputs)
            for out in msg.outputs:
                tokens += out.new_token_ids
                finish = out.finish_reason
        assert len(tokens) == 5 and finish == "length"

        # A request the engine cannot read fails alone; the next one is served.
        engine.requests.sender().send(
            msgspec.msgpack.encode(["add", "bad", "not a token list", []]), timeout=TIMEOUT
        )
        engine.send(
            EngineCoreRequest(request_id="good", prompt_token_ids=[5, 6, 7], sampling_params=params)
        )
        finished: dict[str, str | None] = {}
        while len(finished) < 2:
            msg = engine.receive()
            assert isinstance(msg, EngineCoreOutputs)
            finished |= {o.request_id: o.finish_reason for o in msg.outputs if o.finish_reason}
        assert finished == {"bad": "error", "good": "length"}

        # An abort while idle still answers, so the frontend sees fresh statistics.
        engine.send(AbortRequests(request_ids=["already-gone"]))
        idle = engine.receive()
        assert isinstance(idle, EngineCoreOutputs)
        assert idle.outputs == [] and idle.stats.num_running == 0
        assert idle.stats.num_free_blocks == idle.stats.num_total_blocks

        engine.send(Shutdown())
        assert engine.process.wait(TIMEOUT) == 0


def test_a_model_that_fails_to_load_reports_why_and_exits_non_zero(tmp_path: Path) -> None:
    with running_engine(EngineArgs(model=str(tmp_path / "no-such-model"))) as engine:
        failure = engine.receive()
        assert isinstance(failure, EngineFailure)
        assert "not found" in failure.message
        assert engine.process.wait(TIMEOUT) != 0


def test_the_engine_exits_when_its_parent_dies(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A parent that is SIGKILLed takes its engine with it (no Shutdown, no closed ring)."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, sys
            sys.path[:0] = [{str(Path(__file__).parent)!r}, {str(Path(__file__).parents[1])!r}]
            from test_process import launch, tiny_args
            from pathlib import Path
            engine = launch(tiny_args(Path({str(tiny_model_dir)!r})))
            engine.receive()
            print(engine.process.pid, flush=True)
            os.kill(os.getpid(), 9)
            """
        )
    )
    parent = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=TIMEOUT
    )
    engine_pid = int(parent.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not alive(engine_pid):
            return
        time.sleep(0.05)
    os.kill(engine_pid, 9)
    pytest.fail("the engine outlived its parent")


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for its new parent to reap it."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_outputs_too_large_for_the_ring_are_split_or_fail_their_request(
    tiny_model_dir: Path,
) -> None:
    from trio_llm.engine.process import EngineLoop
    from trio_llm.engine.step.core import EngineCore

    core = EngineCore(tiny_args(tiny_model_dir))
    with ShmRing.create(1 << 16) as requests, ShmRing.create(1 << 16) as outputs:
        loop = EngineLoop(core, requests.receiver(), outputs.sender(), os.getppid())
        # Prompt logprobs with 20 alternatives for 400 positions: far more than 64 KiB.
        huge = SamplingParams(temperature=0.0, max_tokens=2, prompt_logprobs=20)
        small = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
        core.add_request(EngineCoreRequest("huge", list(range(100, 500)), huge))
        for i in range(3):
            core.add_request(EngineCoreRequest(f"s{i}", [7, 8, 9], small))
        finished: dict[str, str | None] = {}
        rx = outputs.receiver()
        while core.has_work():
            loop.send(core.step())
            for raw in rx.receive_all_nowait():
                msg = decode_engine_message(raw)
                assert isinstance(msg, EngineCoreOutputs)
                finished |= {o.request_id: o.finish_reason for o in msg.outputs if o.finish_reason}
        assert finished == {"huge": "error", "s0": "length", "s1": "length", "s2": "length"}
        assert core.stats().num_free_blocks == core.stats().num_total_blocks
