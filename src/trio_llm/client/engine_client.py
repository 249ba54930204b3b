"""The engine client: the frontend half of a running engine, for Trio and asyncio programs alike.

What it owns: the calls (generate, abort, LoRA, statistics; embed, classify and score come
from pooling_calls.py, transcribe from speech_calls.py, tokenizing from tokenizer_calls.py:
mixins over this one object's state) and the tables of their requests in flight (the
output processor's, the pending embeddings and transcriptions, the LoRA loads), which the
engine's outputs are routed to. The link to the engine process (engine_link.py: the rings, the
background tasks, the process's liveness) is shared by every call; engine_process.py starts
and stops the process and hands the link's pieces over.

Invariants:
- Every call checks the link first: once the engine process has exited, every new call raises
  `EngineDeadError` at once, and every `generate()` in flight raises it after the outputs the
  engine published before it died (engine_link.py).
- The abort path never waits: a cancelled or closed `generate()` aborts its engine requests
  from a `finally:` through the link's `post`, without an `await`.
- Leaving `open_engine` stops the engine (Shutdown, then SIGTERM, then SIGKILL, each after a
  timeout), reaps it and closes the rings, whatever way the block is left.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import anyio.lowlevel
import msgspec

from trio_llm.client.collector import RequestCollector
from trio_llm.client.confined_tokenizer import ConfinedTokenizer
from trio_llm.client.embeddings import PendingEmbeddings
from trio_llm.client.engine_link import EngineLink
from trio_llm.client.errors import InvalidPromptError, UnsupportedTaskError
from trio_llm.client.images import ImagePrompt, ImagePrompts, InvalidImageError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.client.lora import LoraRequest, LoraTable
from trio_llm.client.output_processor import OutputProcessor
from trio_llm.client.pooling_calls import PoolingCalls
from trio_llm.client.speech import PendingTranscriptions
from trio_llm.client.speech_calls import SpeechCalls
from trio_llm.client.tokenizer_calls import TokenizerCalls
from trio_llm.config import EngineArgs
from trio_llm.ipc import AsyncRingReceiver, AsyncRingSender
from trio_llm.ipc.codec import encode
from trio_llm.ipc.messages import AbortRequests, EngineReady, ImageInput, SchedulerStats
from trio_llm.sampling_params import SamplingParams, SamplingParamsError
from trio_llm.tasks import TASK_WORDS, USE_WORDS, is_pooling, serves

if TYPE_CHECKING:
    from PIL.Image import Image
    from transformers import PreTrainedTokenizerBase

    from trio_llm.outputs import RequestOutput

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
    block_size: int = 0
    """Tokens per KV block (vLLM's cache_config_info `block_size`)."""
    max_loras: int = 0
    """Adapters one batch may use (vLLM's `max_lora`); 0: LoRA is not enabled."""
    running_loras: tuple[str, ...] = ()
    """The adapters of the running sequences, each once."""
    waiting_loras: tuple[str, ...] = ()


class EngineClient(PoolingCalls, SpeechCalls, TokenizerCalls):
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
        processor: Any | None = None,
    ) -> None:
        """`processor`: a vision-language model's processor (`images.load_processor`), which
        turns pictures into the engine's pixel values and placeholders."""
        self._tokenizer = ConfinedTokenizer(tokenizer)
        self.images: ImagePrompts | None = None if processor is None else ImagePrompts(processor)
        """Pictures into prompts, for a model that takes images (None: text only)."""
        self.tokenizer = tokenizer
        """The model's tokenizer, for use on the event loop's thread only (the client uses it
        there to detokenize). Call `encode`/`decode` to tokenize from anywhere on the loop;
        from another thread, use a copy of your own."""
        self.model_config: ModelConfig = msgspec.structs.replace(
            ready, model=args.served_model_name or ready.model
        )
        self.tool_call_parser = args.tool_call_parser
        """This model's tool-call format when it has its own (`MODEL:tools=...`); None: the
        server's."""
        self.reasoning_parser = args.reasoning_parser
        """Its reasoning format when it has its own (`MODEL:reasoning=...`); None: the
        server's."""
        self.generation_config: dict[str, Any] = generation_config or {}
        """The model's generation_config.json as written (empty when it has none): its
        creator's recommended sampling values, which the server applies as defaults."""
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
        self._max_loras = args.max_loras if args.lora and ready.task == "generate" else 0
        self._transcriptions = PendingTranscriptions()
        self._link = EngineLink(
            process,
            sender,
            receiver,
            stats=SchedulerStats(
                num_free_blocks=ready.num_blocks, num_total_blocks=ready.num_blocks
            ),
            on_outputs=self._transcriptions.process_outputs
            if ready.task == "transcribe"
            else self._embeddings.process_outputs
            if is_pooling(ready.task)
            else self._outputs.process_outputs,
            on_lora=self._loras.answered,
            fail_all=self._fail_all,
        )

    # -- public API ---------------------------------------------------------------------

    @property
    def is_alive(self) -> bool:
        """The engine process runs and this client is still open."""
        return self._link.is_alive

    @property
    def pid(self) -> int:
        """The engine process's id."""
        return self._link.pid

    def stats(self) -> EngineStats:
        s = self._link.scheduler_stats
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
            block_size=self.model_config.block_size,
            max_loras=self._max_loras,
            running_loras=tuple(s.running_loras),
            waiting_loras=tuple(s.waiting_loras),
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

    async def expand_images(
        self,
        prompt_ids: list[int],
        pictures: Sequence[Image | bytes],
        *,
        max_pixels: int | None = None,
    ) -> ImagePrompt:
        """`prompt_ids`, holding one image marker (the processor's image token) per picture,
        as the prompt `generate` takes with the pictures: each marker expanded into its
        picture's placeholders, the pixel values made by the model's processor (on a worker
        thread). `InvalidImageError` for a model that takes no images, a picture it cannot
        read (or of more than `max_pixels` pixels), or markers that do not match the
        pictures."""
        if self.images is None:
            raise InvalidImageError(f"the model {self.model_config.model} does not take images")
        prompt = await self.images.expand(prompt_ids, pictures, max_pixels=max_pixels)
        # The pixels travel inline in the request message: name the picture that overflows the
        # request ring here, rather than `generate` later blaming the prompt's token count.
        total = 0
        for index, image in enumerate(prompt.images):
            total += len(image.pixels)
            if total > self._max_message_bytes:
                raise InvalidImageError(
                    f"the model's processor makes {_mb(total)} of pixel values of the "
                    f"request's pictures up to this one ({list(image.shape)} for it), more "
                    f"than the engine's request ring takes ({_mb(self._max_message_bytes)}); "
                    "send a smaller picture, or fewer, or save the model with a processor that "
                    'makes fewer tiles (SmolVLM: size={"longest_edge": 512})',
                    index,
                )
        return prompt

    def generate(
        self,
        prompt: str | list[int] | ImagePrompt,
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
        images = None
        if isinstance(prompt, ImagePrompt):
            if prompt.images and self.images is None:
                raise InvalidImageError(f"the model {self.model_config.model} does not take images")
            prompt, images = prompt.token_ids, prompt.images or None
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
        return self._generate(request_id, prompt_text, prompt_ids, params, priority, lora, images)

    async def abort(self, request_id: str) -> None:
        """Stop a request: its stream ends with finish_reason 'abort'. Unknown or finished ids
        are ignored."""
        await anyio.lowlevel.checkpoint()
        engine_ids = self._outputs.abort_request(request_id, time.time())
        engine_ids += self._embeddings.abort_request(request_id)
        engine_ids += self._transcriptions.abort_request(request_id)
        if engine_ids:
            self._post(encode(AbortRequests(request_ids=engine_ids)))

    async def wait_dead(self) -> None:
        """Return once the engine process has exited, for whatever reason (a crash, a kill,
        or the shutdown when `open_engine` is left), and every request in flight then has
        had its published outputs and its `EngineDeadError`."""
        await self._link.wait_dead()

    def running(self) -> AbstractAsyncContextManager[None]:
        """Run the background tasks for the block's duration; the client is closed after
        (`open_engine` runs it)."""
        return self._link.running()

    def fail_in_flight(self) -> None:
        """Fail every request still in flight (once): the engine is gone."""
        self._link.fail_in_flight()

    # -- generate -----------------------------------------------------------------------

    async def _generate(
        self,
        request_id: str,
        prompt_text: str | None,
        prompt_ids: list[int] | None,
        params: SamplingParams,
        priority: int,
        lora: str | LoraRequest | None,
        images: list[ImageInput] | None = None,
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
            params.with_seed(),
            arrival_time=arrival_time,
            priority=priority,
            lora=lora,
            images=images,
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
        self._link.check_alive()

    def _post(self, message: bytes) -> None:
        """Send `message` to the engine without waiting (`EngineLink.post`)."""
        self._link.post(message)

    def _fail_all(self, make_error: Callable[[], BaseException]) -> None:
        """Fail every request in flight, of every kind, with the errors `make_error` makes."""
        self._outputs.fail_all(make_error)
        self._embeddings.fail_all(make_error)
        self._loras.fail_all(make_error)
        self._transcriptions.fail_all(make_error)


def _mb(size: int) -> str:
    return f"{size / (1 << 20):.1f} MiB"
