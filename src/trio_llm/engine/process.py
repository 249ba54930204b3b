"""The engine process: EngineCore driven by the two shared-memory rings.

What it owns: the process's life. It reads one `EngineLaunch` from stdin, attaches the rings it
inherited, watches its parent, loads the model, telling the frontend each start-up stage as it
begins (`EngineLoading`), and answers `EngineReady` (or `EngineFailure`, then exits
non-zero). Then it loops: take every pending message (adds, aborts, LoRA loads and unloads,
each answered at once, Shutdown), step while
there is work and send one `EngineCoreOutputs` per step, and block on the request ring's
doorbell when there is none, which costs no CPU (while a grammar compiles and nothing else can
step, it wakes every `GRAMMAR_POLL_SECONDS` to look).

Invariants: the engine never outlives the frontend. A blocked ring operation raises
`PeerDiedError` when the parent exits (a pidfd in the ring's epoll set), and every loop
iteration also checks that the parent is still the same process, for the case where the engine
is busy stepping and never blocks; then the process ends with `os._exit`, skipping the
interpreter's slow teardown. (No PR_SET_PDEATHSIG: it fires when the *thread* that forked
exits, and Trio forks from a worker thread that its thread cache retires after a few seconds
idle, which would kill a healthy engine.) A message the engine cannot read is logged and
dropped, failing its request when the request id can still be read; one request's bad data
never ends the loop. Anything else that escapes is fatal: the frontend gets `EngineFailure`
before the process exits non-zero.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING

import msgspec

from trio_llm.ipc import (
    MessageTooLargeError,
    PeerDiedError,
    RingClosedError,
    RingError,
    RingReceiver,
    RingSender,
    ShmRing,
)
from trio_llm.ipc.codec import DecodeError, decode_frontend_message, encode
from trio_llm.ipc.messages import (
    AbortRequests,
    AudioChunk,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineFailure,
    EngineLaunch,
    EngineLoading,
    LoadLora,
    Shutdown,
    TranscriptionRequest,
    UnloadLora,
)
from trio_llm.triton_absent import mark_triton_absent

if TYPE_CHECKING:
    from trio_llm.config import EngineArgs
    from trio_llm.engine.speech.core import SpeechCore
    from trio_llm.engine.step.core import EngineCore

    Core = EngineCore | SpeechCore

log = logging.getLogger("trio_llm.engine")


class ParentGoneError(Exception):
    """The frontend process exited while the engine was busy."""


def main() -> int:
    logging.basicConfig(
        level=os.environ.get("TRIO_LLM_ENGINE_LOG", "WARNING"),
        format="engine %(levelname)s %(name)s: %(message)s",
    )
    launch = msgspec.msgpack.decode(sys.stdin.buffer.read(), type=EngineLaunch)
    _without_triton_on_cpu(launch.args)
    parent = os.getppid()
    requests = ShmRing.attach(launch.request_ring)
    outputs = ShmRing.attach(launch.output_ring)
    requests.watch_peer(parent)
    outputs.watch_peer(parent)
    rx, tx = requests.receiver(), outputs.sender()
    if os.getppid() != parent:
        return 1  # the parent died before the watch began
    try:
        core = build_core(
            launch.args, on_stage=lambda stage: tx.send(encode(EngineLoading(stage=stage)))
        )
    except Exception as exc:
        _send_failure(tx, f"the engine could not start: {type(exc).__name__}: {exc}")
        return 1
    # The model and its libraries out of the collector's full passes, which would otherwise
    # stall a step for the time it takes to visit them all.
    gc.collect()
    gc.freeze()
    try:
        tx.send(encode(core.ready))
        return EngineLoop(core, rx, tx, parent).run()
    except (PeerDiedError, ParentGoneError):
        # Nobody is left to serve, and the interpreter's teardown with torch loaded takes
        # seconds (measured: 2.6-3.7 s on 2 busy cores, 0.1 s without): leave at once. The
        # kernel releases the rings' memory and fds; log records are already flushed.
        os._exit(1)
    except RingClosedError:
        return 0  # the frontend closed its ends: nobody is left to serve
    except Exception as exc:
        log.exception("engine loop failed")
        _send_failure(tx, f"the engine failed: {type(exc).__name__}: {exc}")
        return 1
    finally:
        requests.close()
        outputs.close()


def _without_triton_on_cpu(args: EngineArgs) -> None:
    """An engine on the CPU never imports Triton (`trio_llm.triton_absent` says why). Kept
    where the engine may run Triton: a CUDA device, or the Triton attention backend asked for
    (interpreted on a CPU)."""
    if args.attention_backend == "triton" or args.device.startswith("cuda"):
        return
    if args.device == "auto":
        import torch

        if torch.cuda.is_available():
            return
    mark_triton_absent()


def build_core(args: EngineArgs, on_stage: Callable[[str], None]) -> Core:
    """The engine kind the model's directory calls for: a speech engine for a Whisper model in
    CTranslate2's format, EngineCore (torch) for everything else. Imported here so that a
    broken install (no torch, say) still reports EngineFailure."""
    from trio_llm.model_files import resolve_model
    from trio_llm.speech.models import is_whisper_directory

    source = resolve_model(args.model)
    if is_whisper_directory(source.path):
        from trio_llm.engine.speech.core import SpeechCore

        return SpeechCore(args, source.path, source.name, on_stage)
    from trio_llm.engine.step.core import EngineCore

    core = EngineCore(args, on_stage=on_stage)
    if not core.pooling:
        core.structured.prepare()  # now, not at the first constrained request
    return core


def _send_failure(tx: RingSender, message: str) -> None:
    """Best effort: with the traceback if it fits the ring, without it otherwise; nothing if
    the frontend is no longer listening."""
    for failure in (
        EngineFailure(message=message, traceback=traceback.format_exc()),
        EngineFailure(message=message[:4096]),
    ):
        try:
            tx.send(encode(failure), timeout=5.0)
            return
        except MessageTooLargeError:
            continue
        except (RingError, TimeoutError):
            return


class EngineLoop:
    def __init__(self, core: Core, rx: RingReceiver, tx: RingSender, parent: int) -> None:
        self.core = core
        self.rx = rx
        self.tx = tx
        self.parent = parent

    def run(self) -> int:
        core = self.core
        while True:
            if os.getppid() != self.parent:
                raise ParentGoneError
            messages = self.rx.receive_all_nowait()
            if not messages and not core.has_work():
                # Sleeps on the doorbell (and the parent's pidfd); briefly while a grammar
                # compiles, since nothing rings when it is done.
                try:
                    messages = [self.rx.receive(timeout=core.idle_timeout())]
                except TimeoutError:
                    continue
            aborted = False
            for raw in messages:
                msg = self._decode(raw)
                if isinstance(msg, Shutdown):
                    return 0
                if isinstance(msg, EngineCoreRequest | TranscriptionRequest | AudioChunk):
                    core.add_request(msg)  # type: ignore[arg-type]  # each kind rejects the others
                elif isinstance(msg, AbortRequests):
                    core.abort_requests(msg.request_ids)
                    aborted = True
                elif isinstance(msg, LoadLora | UnloadLora):
                    self.tx.send(encode(core.update_lora(msg)))
            # After aborts, step even when idle: the abort outputs and fresh stats reach the
            # frontend at once.
            if core.has_work() or aborted:
                self.send(core.step())

    def _decode(self, raw: bytes) -> object:
        try:
            return decode_frontend_message(raw)
        except DecodeError as exc:
            request_id = _request_id_of(raw)
            log.error("unreadable message (request %s): %s", request_id, exc)
            if request_id is not None:
                self.core.reject(request_id, f"the engine could not read the request: {exc}")
            return None

    def send(self, outputs: EngineCoreOutputs) -> None:
        """One message per step; a step too large for the ring goes out in several, and an
        output too large on its own fails its request instead."""
        try:
            self.tx.send(encode(outputs))
            return
        except MessageTooLargeError:
            pass
        for out in outputs.outputs:
            single = EngineCoreOutputs(
                outputs=[out], timestamp=outputs.timestamp, stats=outputs.stats
            )
            try:
                self.tx.send(encode(single))
            except MessageTooLargeError:
                self.core.reject(out.request_id, "the output is too large for the output ring")
        if not outputs.outputs:
            raise MessageTooLargeError("an empty outputs message does not fit the output ring")


def _request_id_of(raw: bytes) -> str | None:
    """The request id of an 'add' message whose other fields do not decode, if readable."""
    try:
        fields = msgspec.msgpack.decode(raw)
    except DecodeError:
        return None
    if isinstance(fields, list) and len(fields) > 1 and fields[0] == "add":
        return fields[1] if isinstance(fields[1], str) else None
    return None
