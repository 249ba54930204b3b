"""The engine client: the frontend half of a running engine, for Trio and asyncio programs alike.

What it owns: a started engine's two shared-memory rings (engine_process.py starts and stops
the process and hands them over), the calls (generate, transcribe, abort, tokenize, LoRA,
statistics; embed, classify and score come from pooling_calls.py), and
three background tasks run for `open_engine`'s block (`running`):
- the output handler reads the output ring and feeds the output processor, in bounded chunks with
  a checkpoint between them, so one huge step never stalls the event loop;
- the request sender (request_sender.py) owns the request ring's sending end and writes what
  could not be written at once;
- the process watcher notices the engine's exit at once (new calls fail from then on) and,
  once the output handler has drained the output ring, fails every request still in flight.

Why it is over 400 lines: it is one object whose state (requests in flight, the engine's
liveness, its statistics) its calls and its three tasks share; the pieces that stand alone
(process start and stop, the request sender, the pooling calls (pooling_calls.py, a mixin of
this class), speech, LoRA, the output and input processors) live in their own modules.

Invariants:
- The abort path never waits: requests are posted through `RequestSender.post`, so a cancelled
  or closed `generate()` aborts its engine requests from a `finally:` without an `await`.
- Once the engine process has exited, every new call raises `EngineDeadError` at once (the
  watcher sees the exit through the process handle), and every `generate()` in flight raises it
  after the outputs the engine published before it died: the output handler, which sees the
  ring end only once it has drained the ring, is the one that fails them. (Were the watcher to
  fail them, it would race the handler and could turn a request's last tokens into an error.)
- Leaving `open_engine` stops the engine (Shutdown, then SIGTERM, then SIGKILL, each after a
  timeout), reaps it and closes the rings, whatever way the block is left.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from trio_llm.client.collector import RequestCollector
from trio_llm.client.confined_tokenizer import ConfinedTokenizer
from trio_llm.client.embeddings import (
    PendingEmbeddings,
)
from trio_llm.client.errors import EngineDeadError, InvalidPromptError, UnsupportedTaskError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.client.lora import LoraRequest, LoraTable
from trio_llm.client.output_processor import OutputProcessor
from trio_llm.client.pooling_calls import PoolingCalls
from trio_llm.client.request_sender import RequestSender
from trio_llm.client.speech import (
    AudioInput,
    PendingTranscriptions,
    check_options,
    new_request,
    transcription_stream,
)
from trio_llm.config import EngineArgs
from trio_llm.ipc import AsyncRingReceiver, AsyncRingSender, RingClosedError
from trio_llm.ipc.codec import decode_engine_message, encode
from trio_llm.ipc.messages import (
    AbortRequests,
    EngineCoreOutputs,
    EngineFailure,
    EngineReady,
    LoraUpdated,
    SchedulerStats,
)
from trio_llm.outputs import (
    TranscriptionOutput,
)
from trio_llm.sampling_params import SamplingParams, SamplingParamsError
from trio_llm.tasks import TASK_WORDS, USE_WORDS, is_pooling, serves

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trio_llm.outputs import RequestOutput

log = logging.getLogger(__name__)

OUTPUT_CHUNK = 64
"""Engine outputs the handler processes between two checkpoints."""
DRAIN_TIMEOUT = 5.0
"""Seconds the watcher waits, after the engine exited, for the output handler to drain the ring
before it fails the requests in flight itself (a bound, should the handler be stuck)."""


ModelConfig = EngineReady
"""What the engine reported about the model it serves: its ready message, with `model` set to
the served model name (`served_model_name`, else the resolved model's name), and `task` what
it serves (generate, embed, score or classify: `trio_llm.tasks`)."""


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's figures as of its latest step, plus the client's own count."""

    num_running: int
    num_waiting: int
    kv_usage: float
    num_free_blocks: int
    num_total_blocks: int
    prefix_cache_queries: int
    """Prompt tokens looked up in the prefix cache (cumulative)."""
    prefix_cache_hits: int
    num_preemptions: int
    num_steps: int
    num_requests_in_flight: int
    """`generate()` calls in this client with an unfinished choice, and embedding inputs
    waiting for their embedding."""


class EngineClient(PoolingCalls):
    """A running engine: generate text (or embeddings, from a pooling engine), tokenize, read
    its statistics.

    Made by `open_engine`, valid inside its `async with` block. Every method may be called from
    any task of the event loop that opened it.
    """

    def __init__(
        self,
        args: EngineArgs,
        process: anyio.abc.Process,
        sender: AsyncRingSender,
        receiver: AsyncRingReceiver,
        tokenizer: PreTrainedTokenizerBase,
        ready: EngineReady,
        *,
        max_message_bytes: int,
        generation_config: dict[str, Any] | None = None,
        unproducible_bytes: frozenset[int] = frozenset(),
    ) -> None:
        self._tokenizer = ConfinedTokenizer(tokenizer)
        self.tokenizer = tokenizer
        """The model's tokenizer, for use on the event loop's thread only (the client uses it
        there to detokenize). Call `encode`/`decode` to tokenize from anywhere on the loop;
        from another thread, use a copy of your own."""
        self.model_config: ModelConfig = msgspec.structs.replace(
            ready, model=args.served_model_name or ready.model
        )
        self.generation_config: dict[str, Any] = generation_config or {}
        """The model's generation_config.json as written (empty when it has none): its
        creator's recommended sampling values, which the server applies as defaults."""
        self._process = process
        self._requests = RequestSender(sender)
        self._receiver = receiver
        self._max_message_bytes = max_message_bytes
        self._stream_interval = args.stream_interval
        self.unproducible_bytes = unproducible_bytes
        """The bytes no token of the model writes (a constraint that forces one is refused)."""
        self._inputs = InputProcessor(
            self._tokenizer,
            max_model_len=ready.max_model_len,
            vocab_size=ready.vocab_size,
            unproducible_bytes=unproducible_bytes,
        )
        self._outputs = OutputProcessor(tokenizer, ready.eos_token_ids)
        self._embeddings = PendingEmbeddings()
        self._loras = LoraTable(args.lora and ready.task == "generate", args.lora_modules)
        self._transcriptions = PendingTranscriptions()
        self._process_outputs = (
            self._transcriptions.process_outputs
            if ready.task == "transcribe"
            else self._embeddings.process_outputs
            if is_pooling(ready.task)
            else self._outputs.process_outputs
        )
        self._scheduler_stats = SchedulerStats(
            num_free_blocks=ready.num_blocks, num_total_blocks=ready.num_blocks
        )
        self._dead = anyio.Event()
        """Set once the engine process has exited (or the client closed)."""
        self._drained = anyio.Event()
        """Set once every request in flight at the engine's death has been failed."""
        self._failure: str | None = None
        """What the engine said in its EngineFailure message, if it sent one."""
        self._exit: str | None = None
        """How the engine process ended, once it has."""
        self._closed = False

    # -- public API ---------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        """The engine process runs and this client is still open."""
        return not self._dead.is_set() and not self._closed

    @property
    def pid(self) -> int:
        """The engine process's id."""
        return self._process.pid

    def stats(self) -> EngineStats:
        s = self._scheduler_stats
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_usage=s.kv_usage,
            num_free_blocks=s.num_free_blocks,
            num_total_blocks=s.num_total_blocks,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            num_steps=s.num_steps,
            num_requests_in_flight=self._outputs.num_requests
            + self._embeddings.num_requests
            + self._transcriptions.num_requests,
        )

    @property
    def task(self) -> str:
        """What the engine serves: 'generate', 'embed', 'score', 'classify' or 'transcribe'."""
        return self.model_config.task

    @property
    def loras(self) -> dict[str, str]:
        """The LoRA adapters this engine serves: name -> PEFT directory."""
        return dict(self._loras.loaded)

    async def load_lora(self, name: str, path: str) -> None:
        """Load the PEFT adapter at `path` (a directory the engine process reads) and serve it
        as `name`; `LoraError` with the engine's reason when it cannot (another base model's
        shapes, a rank over `max_lora_rank`, every one of `max_loras` slots taken, LoRA not
        enabled)."""
        self._check_alive()
        message, update = self._loras.load(name, path)
        self._post(encode(message))
        await update.wait()

    async def unload_lora(self, name: str) -> None:
        """Stop serving adapter `name`: new requests for it are refused, those in flight
        finish on it. `LoraNotFoundError` when it is not loaded."""
        self._check_alive()
        message, update = self._loras.unload(name)
        self._post(encode(message))
        await update.wait()

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        lora: str | LoraRequest | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Generate from `prompt`; iterate the result for `RequestOutput`s (see
        `params.output_kind`). `lora`: generate with a LoRA adapter, by its loaded name, or as
        a `LoraRequest` (loaded first when no adapter of its name is; `LoraNotFoundError` for
        a name that is not loaded).

        Raises here, before anything is sent: `EngineDeadError`, `SamplingParamsError`, and for
        a prompt given as token ids `InvalidPromptError`/`PromptTooLongError`. A text prompt is
        tokenized when iteration starts (large ones on a worker thread) and its errors raise
        from the first `__anext__()`, still before anything is sent; so does the
        `SamplingParamsError` of a constraint the grammar engine cannot enforce.

        Leaving the iteration early (break, `aclose()`, an exception or cancellation, including
        KeyboardInterrupt) aborts the request in the engine. `abort(request_id)` from elsewhere
        ends the stream with finish_reason 'abort'. A failure the engine reports for this
        request raises `EngineRequestError`.
        """
        self._check_alive()
        self._check_task("generate")
        self._check_priority(priority)
        if isinstance(prompt, str):
            params.validate()
            params.validate_vocab(self.model_config.vocab_size)
            prompt_text, prompt_ids = prompt, None
        else:
            prompt_text, prompt_ids = None, list(prompt)
            self._inputs.check_request(prompt_ids, params)
        if isinstance(lora, str):
            self._loras.check(lora)
        if request_id is None:
            request_id = uuid.uuid4().hex
        elif self._outputs.has_request(request_id):
            raise ValueError(f"request id {request_id!r} is already in flight")
        return self._generate(request_id, prompt_text, prompt_ids, params, priority, lora)

    async def abort(self, request_id: str) -> None:
        """Stop a request: its stream ends with finish_reason 'abort'. Unknown or finished ids
        are ignored."""
        await anyio.lowlevel.checkpoint()
        engine_ids = self._outputs.abort_request(request_id, time.time())
        engine_ids += self._embeddings.abort_request(request_id)
        engine_ids += self._transcriptions.abort_request(request_id)
        if engine_ids:
            self._post(encode(AbortRequests(request_ids=engine_ids)))

    def transcribe(
        self,
        audio: AudioInput,
        *,
        task: str = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
        max_seconds: float | None = None,
        request_id: str | None = None,
        priority: int = 0,
    ) -> AsyncGenerator[TranscriptionOutput, None]:
        """Transcribe (or, with task 'translate', translate into English) an audio file's bytes,
        a path to one, or 16 kHz mono samples, from a speech engine; iterate the result for one
        `TranscriptionOutput` per 30-second window the engine decodes (the last `finished`).

        Raises here, before anything is sent: `UnsupportedTaskError` on a text engine,
        `InvalidPromptError` naming the field for a task, language or temperature the model
        cannot serve (translation from an English-only model, say). The file is decoded when
        iteration starts (on a worker thread) and its `AudioError` (empty, not audio, longer
        than `max_seconds`) raises from the first `__anext__()`. `language` None: detected
        from the first window; `temperature` 0 falls back to hotter decoding where a window
        fails Whisper's thresholds, as OpenAI's does. Leaving the iteration early aborts the
        request in the engine, which stops within the window it is decoding."""
        self._check_alive()
        self._check_task("transcribe")
        code = check_options(
            self.model_config, task=task, language=language, temperature=temperature
        )
        request = new_request(
            request_id=request_id,
            task=task,
            language=code,
            prompt=prompt,
            temperature=temperature,
            word_timestamps=word_timestamps,
            priority=priority,
        )
        if self._transcriptions.has_request(request.request_id):
            raise ValueError(f"request id {request.request_id!r} is already in flight")
        return transcription_stream(
            self._transcriptions, self._post, self._check_alive, audio, request, max_seconds
        )

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return await self._inputs.encode(text, add_special_tokens=add_special_tokens)

    async def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """The text of `token_ids` (a long list is decoded off the event loop)."""
        return await self._tokenizer.decode(
            list(token_ids), skip_special_tokens=skip_special_tokens
        )

    async def vocab_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """Each id's entry in the vocabulary, as the tokenizer spells it ('Ġthe')."""
        return await self._tokenizer.vocab_tokens(list(token_ids))

    @property
    def chat_template(self) -> str | None:
        """The model's chat template text (None: it has none, or only named ones)."""
        template = getattr(self.tokenizer, "chat_template", None)
        return template if isinstance(template, str) else None

    async def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        add_special_tokens: bool = False,
    ) -> list[int]:
        """Render `messages` with the model's chat template and tokenize the result (with
        `add_special_tokens`, the tokenizer's special tokens on top of the template's)."""
        return await self._inputs.apply_chat_template(
            messages,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            chat_template_kwargs=chat_template_kwargs,
            add_special_tokens=add_special_tokens,
        )

    def decoded_tokens(self, token_ids: Sequence[int]) -> list[str]:
        """The text logprobs show for each token (a partial UTF-8 character as `bytes:\\xNN`).
        On the event loop's thread only."""
        return [self._outputs.decoded_token(t) for t in token_ids]

    async def wait_dead(self) -> None:
        """Return once the engine process has exited, for whatever reason (a crash, a kill,
        or the shutdown when `open_engine` is left), and every request in flight then has
        had its published outputs and its `EngineDeadError`."""
        await self._drained.wait()

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Run the background tasks for the block's duration; the client is closed after
        (`open_engine` runs it)."""
        body_error: BaseException | None = None
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(self._watch_process)
            tasks.start_soon(self._handle_outputs)
            tasks.start_soon(self._requests.run)
            try:
                yield
            except BaseException as exc:
                # Re-raised below, outside the task group, so that the caller gets its own
                # exception rather than an ExceptionGroup around it.
                body_error = exc
            finally:
                self._closed = True
                tasks.cancel_scope.cancel()
        if body_error is not None:
            raise body_error

    # -- generate -----------------------------------------------------------------------

    async def _generate(
        self,
        request_id: str,
        prompt_text: str | None,
        prompt_ids: list[int] | None,
        params: SamplingParams,
        priority: int,
        lora: str | LoraRequest | None,
    ) -> AsyncGenerator[RequestOutput, None]:
        if isinstance(lora, LoraRequest):
            if lora.name not in self._loras.loaded:
                pending = self._loras.pending_load(lora.name)
                if pending is not None:  # another request's load of it
                    await pending.wait()
                else:
                    await self.load_lora(lora.name, lora.path)
            lora = lora.name
        if prompt_ids is None:
            assert prompt_text is not None
            prompt_ids = await self._inputs.encode(prompt_text)
            self._inputs.check_request(prompt_ids, params)
        if params.bad_words:
            params = await self._inputs.with_bad_words_tokenized(params)
            params.validate_vocab(self.model_config.vocab_size)
        if params.constraint is not None:
            await self._inputs.check_constraint(params.constraint)
        self._check_alive()
        arrival_time = time.time()
        engine_requests = InputProcessor.engine_requests(
            request_id,
            prompt_ids,
            params,
            arrival_time=arrival_time,
            priority=priority,
            lora=lora,
        )
        messages = [encode(r) for r in engine_requests]
        if max(map(len, messages)) > self._max_message_bytes:
            raise InvalidPromptError(
                f"the prompt ({len(prompt_ids)} tokens) does not fit in the engine's request "
                f"ring; start the engine with a larger ring_capacity"
            )
        collector = RequestCollector(
            request_id,
            prompt_text,
            prompt_ids,
            n=params.n,
            kind=params.output_kind,
            arrival_time=arrival_time,
            stream_interval=self._stream_interval,
        )
        self._outputs.add_request(collector, engine_requests)
        finished = False
        try:
            for message in messages:
                self._post(message)
            while not finished:
                output = await collector.get()
                finished = output.finished
                yield output
        finally:
            # No await here: this runs when the scope is cancelled and when the generator is
            # closed or finalized, and must abort the request in every case.
            unfinished = self._outputs.remove_request(request_id)
            if unfinished:
                self._post(encode(AbortRequests(request_ids=unfinished)))

    def _check_priority(self, priority: int) -> None:
        """A non-zero priority only where the engine schedules by priority (as vLLM refuses
        it), so that no client can jump a first-come-first-served queue."""
        if priority and not self.model_config.priority_scheduling:
            raise SamplingParamsError(
                "priority",
                f"priority {priority} is honoured only with --scheduling-policy priority; "
                "this server schedules first come, first served (priority must be 0)",
            )

    def _check_task(self, use: str) -> None:
        """`UnsupportedTaskError` unless this engine serves `use` (`trio_llm.tasks`)."""
        if not serves(self.task, use):
            name = self.model_config.model
            raise UnsupportedTaskError(
                f"the model {name!r} is generative: it does not serve {USE_WORDS[use]}"
                if self.task == "generate"
                else f"the model {name!r} serves {TASK_WORDS[self.task]}, not {USE_WORDS[use]}"
            )

    def _check_alive(self) -> None:
        if self._closed:
            raise EngineDeadError("the engine was shut down: open_engine() has exited")
        if self._dead.is_set():
            raise EngineDeadError(self._dead_reason())

    def _dead_reason(self) -> str:
        if self._failure is not None:
            return f"the engine failed: {self._failure}"
        if self._exit is not None:
            return f"the engine process exited unexpectedly ({self._exit})"
        return "the engine process has exited"

    # -- the request ring -----------------------------------------------------------------

    def _post(self, message: bytes) -> None:
        """Send `message` to the engine without waiting (`RequestSender.post`)."""
        if self.is_alive:
            self._requests.post(message)

    # -- the output ring ------------------------------------------------------------------

    async def _handle_outputs(self) -> None:
        """The one background task that reads the output ring and routes every output; once
        the ring has ended (the engine exited and everything it published is read), it fails
        the requests still in flight."""
        since_checkpoint = 0
        try:
            while True:
                for buf in await self._receiver.receive_batch():
                    message = decode_engine_message(buf)
                    if isinstance(message, EngineCoreOutputs):
                        now = time.time()
                        outputs = message.outputs
                        for start in range(0, len(outputs), OUTPUT_CHUNK):
                            if since_checkpoint >= OUTPUT_CHUNK:
                                await anyio.lowlevel.checkpoint()
                                since_checkpoint = 0
                            chunk = outputs[start : start + OUTPUT_CHUNK]
                            since_checkpoint += len(chunk)
                            to_abort = self._process_outputs(chunk, now)
                            if to_abort:
                                self._post(encode(AbortRequests(request_ids=to_abort)))
                        self._scheduler_stats = message.stats
                    elif isinstance(message, LoraUpdated):
                        self._loras.answered(message)
                    elif isinstance(message, EngineFailure):
                        log.error("the engine failed: %s\n%s", message.message, message.traceback)
                        self._failure = message.message
                    else:
                        log.warning("ignoring an unexpected %s from the engine", type(message))
        except RingClosedError:
            pass  # the engine is gone, and every output it published has been routed
        # The ring ends when the engine's process dies, often a moment before its exit status
        # is known: wait for it (bounded), so the requests' error says how the engine ended.
        with anyio.move_on_after(DRAIN_TIMEOUT):
            await self._dead.wait()
        self.fail_in_flight()

    # -- the process ----------------------------------------------------------------------

    async def _watch_process(self) -> None:
        code = await self._process.wait()
        self._exit = describe_exit(code)
        self._mark_dead()
        # The output handler fails the requests in flight once it has drained the ring; this
        # is only the bound, should it never see the ring end.
        with anyio.move_on_after(DRAIN_TIMEOUT):
            await self._drained.wait()
        if not self._closed:
            log.error("%s", self._dead_reason())
        self.fail_in_flight()

    def _mark_dead(self) -> None:
        """No new call reaches the engine from now on."""
        self._dead.set()
        self._requests.clear()

    def fail_in_flight(self) -> None:
        """Fail every request still in flight (once): the engine is gone."""
        self._mark_dead()
        if self._drained.is_set():
            return
        reason = self._dead_reason()
        self._outputs.fail_all(lambda: EngineDeadError(reason))
        self._embeddings.fail_all(lambda: EngineDeadError(reason))
        self._loras.fail_all(lambda: EngineDeadError(reason))
        self._transcriptions.fail_all(lambda: EngineDeadError(reason))
        self._drained.set()


def describe_exit(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
