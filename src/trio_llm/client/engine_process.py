"""The engine process: start it, hand it its launch message, wait for it to be ready, stop it.

What it owns: `open_engine`, which creates the two rings, spawns `python -m trio_llm.engine`
in its own session (so a terminal's Ctrl-C reaches only the frontend, which then stops the
engine in order), sends it `EngineLaunch` (its `EngineArgs` and the rings' specs) on stdin,
loads the tokenizer and reads the generation config on a worker thread while the engine loads
the model, passes on the engine's start-up stages (`EngineLoading`), and hands the ready
engine to an `EngineClient` (engine_client.py) for the block's duration.

Invariants:
- A start that fails raises `EngineStartError` with the engine's own message (and its
  traceback), or says how the process ended before it was ready; it never hangs past
  `startup_timeout`.
- Leaving `open_engine` stops the engine (Shutdown, then SIGTERM, then SIGKILL, each after a
  timeout), reaps it and closes the rings, whatever way the block is left; an engine that never
  became ready reads no messages yet and gets SIGTERM at once.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.to_thread

from trio_llm.client.engine_client import EngineClient
from trio_llm.client.engine_link import describe_exit
from trio_llm.client.errors import EngineStartError
from trio_llm.client.images import largest_pixels_bytes, load_processor, takes_images
from trio_llm.config import EngineArgs
from trio_llm.grammar import unproducible_bytes
from trio_llm.ipc import AsyncRingReceiver, AsyncRingSender, RingClosedError, RingError, ShmRing
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import EngineFailure, EngineLaunch, EngineLoading, EngineReady, Shutdown
from trio_llm.model_files import load_tokenizer, read_generation_config, resolve_model

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SHUTDOWN_TIMEOUT = 5.0
"""Seconds the engine gets to exit after the Shutdown message, then again after SIGTERM."""

OnStage = Callable[[str], None]
"""Hears each start-up stage of the engine as it begins ('loading the weights', ...)."""


def log_stage(label: str) -> OnStage:
    """The default `on_stage`: each stage logged at info level as `engine <label>: <stage>`
    (the label names the engine: its model, `model[replica]` when it has replicas)."""
    return lambda stage: log.info("engine %s: %s", label, stage)


def replica_label(args: EngineArgs, index: int) -> str:
    """How logs and errors name one engine: `model[replica]`."""
    return f"{args.served_model_name or args.model}[{index}]"


def engine_args_of(model: str | EngineArgs | None, engine_args: dict[str, Any]) -> EngineArgs:
    """`open_engine`'s arguments as the one `EngineArgs` (built once)."""
    if isinstance(model, EngineArgs):
        if engine_args:
            raise TypeError("give either EngineArgs or its fields as keyword arguments, not both")
        return model
    if model is not None:
        engine_args = {**engine_args, "model": model}
    return EngineArgs(**engine_args)


_TOKENIZER_LOADING = threading.Lock()
"""Engines started at once load their tokenizers (and probe a vision model's processor) on
worker threads, one at a time: transformers' lazy imports are not thread-safe (two first
imports at once raised "cannot import name 'AutoTokenizer'", as a LLaVA's processor probe
beside a text model's tokenizer did)."""


@dataclass(frozen=True, slots=True)
class _Tokenizer:
    """What the frontend reads of the model's files while the engine loads it."""

    tokenizer: PreTrainedTokenizerBase
    generation_config: dict[str, Any]
    unproducible_bytes: frozenset[int]
    """The bytes no token writes (a pass over the vocabulary, done here off the event loop):
    the constraint check refuses a grammar that forces one."""
    processor: Any | None = None
    """A vision-language model's processor (`images.load_processor`); None for text."""


def _load_tokenizer(model: str, chat_template: str | None = None) -> _Tokenizer:
    """`chat_template`: a template file that replaces the model's own."""
    with _TOKENIZER_LOADING:
        source = resolve_model(model)
        tokenizer = load_tokenizer(source)
        if chat_template is not None:
            tokenizer.chat_template = Path(chat_template).read_text(encoding="utf-8")
        _compile_chat_template(tokenizer)
        return _Tokenizer(
            tokenizer,
            read_generation_config(source.path),
            unproducible_bytes(tokenizer),
            load_processor(source.path) if takes_images(source.path) else None,
        )


PICTURES_IN_RING = 2
"""Largest pictures a vision model's request ring holds in one request: more are refused with a
400 naming the picture that overflows (EngineClient)."""
MAX_RING = 1 << 30


def request_ring_capacity(args: EngineArgs) -> int:
    """`ring_capacity`, or for a vision-language model room for `PICTURES_IN_RING` of the
    largest pictures its processor makes (a memfd's pages are taken as they are written: a
    larger ring costs memory only when pictures fill it). Without it the default 8 MiB ring
    refused any ordinary photo for SmolVLM as downloaded."""
    try:
        path = resolve_model(args.model).path
        if not takes_images(path):
            return args.ring_capacity
        with _TOKENIZER_LOADING:
            largest = largest_pixels_bytes(load_processor(path))
    except Exception:  # the model's own error comes from the engine's start, with its reason
        log.debug(
            "the request ring keeps its size: the processor could not be probed", exc_info=True
        )
        return args.ring_capacity
    wanted = PICTURES_IN_RING * largest + (1 << 20)  # and a megabyte for the prompt's tokens
    return max(args.ring_capacity, min(wanted, MAX_RING))


def _compile_chat_template(tokenizer: PreTrainedTokenizerBase) -> None:
    """Render a one-message conversation: jinja compiles the template once per process (and
    transformers remembers it), here off the event loop rather than in the first request that
    renders inline on it."""
    if getattr(tokenizer, "chat_template", None):
        try:
            tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
        except Exception:  # a template that needs more is compiled all the same
            log.debug("the warm-up render of the chat template failed", exc_info=True)


async def _handshake(
    process: anyio.abc.Process, receiver: AsyncRingReceiver, args: EngineArgs, on_stage: OnStage
) -> tuple[EngineReady, _Tokenizer]:
    """Load the tokenizer (and read the generation config) while the engine loads the model;
    then wait for its ready message, passing on its progress."""
    try:
        with anyio.fail_after(args.startup_timeout):
            try:
                loaded = await anyio.to_thread.run_sync(
                    _load_tokenizer, args.model, args.chat_template, abandon_on_cancel=True
                )
            except Exception as exc:
                raise EngineStartError(
                    f"cannot load the tokenizer of {args.model!r}: {exc}"
                ) from exc
            try:
                message = decode_engine_message(await receiver.receive())
                while isinstance(message, EngineLoading):
                    on_stage(message.stage)
                    message = decode_engine_message(await receiver.receive())
            except RingClosedError:
                code = await process.wait()
                raise EngineStartError(
                    f"the engine process ended before it was ready ({describe_exit(code)}); "
                    "its log above says why"
                ) from None
    except TimeoutError:
        raise EngineStartError(
            f"the engine was not ready within startup_timeout={args.startup_timeout} s"
        ) from None
    if isinstance(message, EngineFailure):
        raise EngineStartError(message.message, engine_traceback=message.traceback)
    if not isinstance(message, EngineReady):
        raise EngineStartError(f"the engine sent {type(message).__name__} before it was ready")
    return message, loaded


async def _stop_process(
    process: anyio.abc.Process, sender: AsyncRingSender, *, ready: bool
) -> None:
    """Shutdown message, then SIGTERM, then SIGKILL, each after a timeout; always reaps.
    An engine that never became ready reads no messages yet: it gets SIGTERM at once.
    Call it shielded."""
    if process.returncode is None:
        graceful = ready
        if ready:
            try:
                sender.send_nowait(encode(Shutdown()))
            except (anyio.WouldBlock, RingError):
                graceful = False  # a full or closed ring: SIGTERM does the job
        if not graceful or not await _exits_within(process, SHUTDOWN_TIMEOUT):
            if graceful:
                log.warning("the engine did not exit after Shutdown; sending SIGTERM")
            process.terminate()
            if not await _exits_within(process, SHUTDOWN_TIMEOUT):
                log.warning("the engine did not exit after SIGTERM; sending SIGKILL")
                process.kill()
                await process.wait()
    await process.aclose()


async def _exits_within(process: anyio.abc.Process, seconds: float) -> bool:
    with anyio.move_on_after(seconds):
        await process.wait()
        return True
    return False


@asynccontextmanager
async def open_engine(
    model: str | EngineArgs | None = None, *, on_stage: OnStage | None = None, **engine_args: Any
) -> AsyncIterator[EngineClient]:
    """Start an engine process and yield a client for it; stop the engine on the way out.

    `model` is the model's name (then `engine_args` are the other `EngineArgs` fields; None:
    the default model) or the whole `EngineArgs`. `on_stage` hears each start-up stage as the
    engine begins it (by default they are logged at info level). Raises `EngineStartError` with
    the engine's own message when the model cannot be loaded, or when it is not ready within
    `startup_timeout` seconds.
    """
    args = engine_args_of(model, engine_args)
    on_stage = on_stage or log_stage(args.served_model_name or args.model)
    request_capacity = await anyio.to_thread.run_sync(request_ring_capacity, args)
    with (
        ShmRing.create(request_capacity) as request_ring,
        ShmRing.create(args.ring_capacity) as output_ring,
    ):
        launch = EngineLaunch(
            args=args, request_ring=request_ring.spec, output_ring=output_ring.spec
        )
        process = await anyio.open_process(
            [sys.executable, "-m", "trio_llm.engine"],
            stdin=subprocess.PIPE,
            stdout=None,
            stderr=None,
            pass_fds=(*request_ring.fds, *output_ring.fds),
            # Its own session: a terminal's Ctrl-C reaches only this process, whose
            # KeyboardInterrupt then shuts the engine down in order.
            start_new_session=True,
        )
        sender, receiver = request_ring.async_sender(), output_ring.async_receiver()
        client: EngineClient | None = None
        try:
            request_ring.watch_peer(process.pid)
            output_ring.watch_peer(process.pid)
            assert process.stdin is not None
            try:
                await process.stdin.send(encode(launch))
                await process.stdin.aclose()
            except (anyio.BrokenResourceError, OSError):
                pass  # it died already; the handshake says how
            ready, loaded = await _handshake(process, receiver, args, on_stage)
            client = EngineClient(
                args,
                process,
                sender,
                receiver,
                loaded.tokenizer,
                ready,
                max_message_bytes=sender.sync.max_message_size,
                generation_config=loaded.generation_config,
                unproducible_bytes=loaded.unproducible_bytes,
                processor=loaded.processor,
            )
            async with client.running():
                yield client
        finally:
            with anyio.CancelScope(shield=True):
                await _stop_process(process, sender, ready=client is not None)
            if client is not None:
                client.fail_in_flight()
