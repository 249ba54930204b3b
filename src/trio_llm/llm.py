"""`LLM`: synchronous offline batch inference on top of the async engine client.

What it owns: one background thread running a Trio event loop that holds `open_engine` open for
the object's lifetime, so the engine (and its model) is loaded once, not per call. Each
`generate()` call runs its prompts concurrently in a nursery on that loop (the engine batches
them) and blocks the calling thread until all are done; `embed()`, `score()` and
`classify()` do the same for a pooling model's outputs, `transcribe()` for audio on a speech
model.

Invariants: the engine lives exactly as long as the `LLM`: `close()` (or leaving the `with`
block, or garbage collection, or interpreter exit) stops it. A KeyboardInterrupt in the calling
thread cancels the batch in flight, which aborts its requests in the engine, and then propagates.
"""

from __future__ import annotations

import copy
import threading
import weakref
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future
from contextlib import aclosing
from functools import partial
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import msgspec
import trio

from trio_llm.client.engine_client import EngineClient
from trio_llm.client.engine_process import open_engine
from trio_llm.client.lora import LoraRequest
from trio_llm.client.speech import AudioInput, final_output, samples_of
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trio_llm.client.engine_client import ModelConfig
    from trio_llm.outputs import (
        ClassificationRequestOutput,
        EmbeddingRequestOutput,
        RequestOutput,
        ScoringRequestOutput,
        TranscriptionOutput,
    )

Prompt = str | list[int]
Lora = str | LoraRequest | None
_T = TypeVar("_T")


class _Loop:
    """The event-loop thread and the engine it keeps open. Separate from `LLM` so that
    `weakref.finalize` can stop it without keeping the `LLM` alive."""

    def __init__(self, model: str | None, engine_args: dict[str, Any]) -> None:
        self.client: EngineClient | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self._thread = threading.Thread(
            target=trio.run, args=(self._main, model, engine_args), name="trio-llm", daemon=True
        )
        self._thread.start()
        self._started.wait()
        if self._start_error is not None:
            self._thread.join()
            raise self._start_error

    async def _main(self, model: str | None, engine_args: dict[str, Any]) -> None:
        try:
            async with open_engine(model, **engine_args) as client, trio.open_nursery() as nursery:
                self.client, self._nursery = client, nursery
                self._token = trio.lowlevel.current_trio_token()
                self._started.set()
                await trio.sleep_forever()  # until stop() cancels the nursery
        except BaseException as exc:
            if self._started.is_set():
                raise
            self._start_error = exc
            self._started.set()

    def submit(
        self, fn: Callable[..., Awaitable[_T]], *args: Any
    ) -> tuple[Future[_T], trio.CancelScope]:
        """Run `fn(*args)` as a task on the loop; its result arrives through the future, and
        cancelling the scope stops it."""
        future: Future[_T] = Future()
        scope = trio.CancelScope()

        async def task() -> None:
            try:
                with scope:
                    result = await fn(*args)
            except BaseException as exc:
                future.set_exception(exc)
                if isinstance(exc, trio.Cancelled):
                    raise
            else:
                if scope.cancelled_caught:
                    future.set_exception(KeyboardInterrupt())
                else:
                    future.set_result(result)

        assert self._nursery is not None
        trio.from_thread.run_sync(self._nursery.start_soon, task, trio_token=self._token)
        return future, scope

    def cancel(self, scope: trio.CancelScope) -> None:
        trio.from_thread.run_sync(scope.cancel, trio_token=self._token)

    def stop(self) -> None:
        if self._nursery is not None and self._thread.is_alive():
            try:
                trio.from_thread.run_sync(self._nursery.cancel_scope.cancel, trio_token=self._token)
            except trio.RunFinishedError:
                pass
            self._thread.join()


class LLM:
    """A model loaded in an engine process, for synchronous batch generation.

    ```python
    with LLM() as llm:
        outputs = llm.generate(["Hello", "Bonjour"], SamplingParams(max_tokens=32))
    ```
    `engine_args` are `EngineArgs` fields.
    """

    def __init__(self, model: str | None = None, **engine_args: Any) -> None:
        self._loop = _Loop(model, engine_args)
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._finalizer = weakref.finalize(self, self._loop.stop)

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer, this object's own copy: the engine client's instance is busy
        on its event loop's thread, and a tokenizer must not be used by two threads at once."""
        if self._tokenizer is None:
            future, _ = self._loop.submit(self._copy_tokenizer)  # copied on the loop's thread
            self._tokenizer = future.result()
        return self._tokenizer

    @property
    def model_config(self) -> ModelConfig:
        return self._client.model_config

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        lora: Lora | Sequence[Lora] = None,
    ) -> list[RequestOutput]:
        """One finished `RequestOutput` per prompt, in the prompts' order.

        `prompts` is one prompt or a list of them (text or token ids); `params` is one
        `SamplingParams` for all, or one per prompt; `lora` is the LoRA adapter to generate
        with (a loaded adapter's name, or a `LoraRequest`, loaded on first use; None: the base
        model), for all or one per prompt.
        """
        if not self._finalizer.alive:
            raise RuntimeError("this LLM is closed")
        batch = _as_prompt_list(prompts)
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(batch)
        if len(params) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(params)} SamplingParams")
        final = [
            msgspec.structs.replace(p, output_kind=RequestOutputKind.FINAL_ONLY) for p in params
        ]
        loras = [lora] * len(batch) if lora is None or isinstance(lora, str | LoraRequest) else lora
        if len(loras) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(loras)} LoRA adapters")
        future, scope = self._loop.submit(self._run_batch, batch, final, list(loras))
        return self._wait(future, scope)

    def _wait(self, future: Future[_T], scope: trio.CancelScope) -> _T:
        try:
            # Future.result() waits on a lock, which a KeyboardInterrupt interrupts.
            return future.result()
        except KeyboardInterrupt:
            self._loop.cancel(scope)  # aborts the batch's requests in the engine
            raise

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        truncate_prompt_tokens: int | None = None,
        dimensions: int | None = None,
    ) -> list[EmbeddingRequestOutput]:
        """One embedding per prompt (text or token ids), in order, from a model served for
        embeddings; the options are `EngineClient.embed_batch`'s."""
        if not self._finalizer.alive:
            raise RuntimeError("this LLM is closed")
        batch = _as_prompt_list(prompts)
        embed = partial(
            self._client.embed_batch,
            truncate_prompt_tokens=truncate_prompt_tokens,
            dimensions=dimensions,
        )
        future, scope = self._loop.submit(embed, batch)
        return self._wait(future, scope)

    def transcribe(
        self,
        audio: AudioInput | Sequence[AudioInput],
        *,
        task: str = "transcribe",
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        word_timestamps: bool = False,
    ) -> list[TranscriptionOutput]:
        """One finished transcription per audio input (a file's bytes, a path, or 16 kHz
        samples), in order, from a speech model; the engine batches their windows. The
        options are `EngineClient.transcribe`'s (task 'translate' translates into English)."""
        if not self._finalizer.alive:
            raise RuntimeError("this LLM is closed")
        inputs = list(audio) if isinstance(audio, list | tuple) else [audio]
        options = {
            "task": task,
            "language": language,
            "prompt": prompt,
            "temperature": temperature,
            "word_timestamps": word_timestamps,
        }
        future, scope = self._loop.submit(self._run_transcriptions, inputs, options)
        return self._wait(future, scope)

    def score(
        self,
        text_1: str | Sequence[str],
        text_2: str | Sequence[str],
        *,
        truncate_prompt_tokens: int | None = None,
    ) -> list[ScoringRequestOutput]:
        """One score per pair (`text_1` against each of `text_2`, or pair i of two lists of
        one length), from a cross-encoder or an embedding model (cosine); as
        `EngineClient.score`."""
        score = partial(self._client.score, truncate_prompt_tokens=truncate_prompt_tokens)
        future, scope = self._loop.submit(score, text_1, text_2)
        return self._wait(future, scope)

    def classify(
        self, prompts: Prompt | Sequence[Prompt], *, truncate_prompt_tokens: int | None = None
    ) -> list[ClassificationRequestOutput]:
        """Each prompt's class probabilities, in order, from a classifier or cross-encoder;
        as `EngineClient.classify`."""
        batch = _as_prompt_list(prompts)
        classify = partial(self._client.classify, truncate_prompt_tokens=truncate_prompt_tokens)
        future, scope = self._loop.submit(classify, batch)
        return self._wait(future, scope)

    def close(self) -> None:
        """Stop the engine; idempotent."""
        self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def _client(self) -> EngineClient:
        if not self._finalizer.alive or self._loop.client is None:
            raise RuntimeError("this LLM is closed")
        return self._loop.client

    async def _copy_tokenizer(self) -> PreTrainedTokenizerBase:
        return copy.deepcopy(self._client.tokenizer)

    async def _run_transcriptions(
        self, inputs: list[AudioInput], options: dict[str, Any]
    ) -> list[TranscriptionOutput]:
        client = self._client
        # Every input is decoded, and its options checked, before any is sent: a bad one
        # fails the whole call with its own error.
        decoded = [await samples_of(a, None) for a in inputs]
        streams = [client.transcribe(a, **options) for a in decoded]
        results: list[TranscriptionOutput | None] = [None] * len(inputs)

        async def run(index: int) -> None:
            results[index] = await final_output(streams[index])

        async with trio.open_nursery() as nursery:
            for index in range(len(inputs)):
                nursery.start_soon(run, index)
        return [r for r in results if r is not None]

    async def _run_batch(
        self, prompts: list[Prompt], params: list[SamplingParams], loras: list[Lora]
    ) -> list[RequestOutput]:
        client = self._client
        results: list[RequestOutput | None] = [None] * len(prompts)
        # Everything is checked before anything is sent, so a bad prompt fails the whole call.
        streams = [
            client.generate(p, sp, lora=lora)
            for p, sp, lora in zip(prompts, params, loras, strict=True)
        ]

        async def run(index: int) -> None:
            async with aclosing(streams[index]) as stream:
                async for output in stream:
                    results[index] = output

        async with trio.open_nursery() as nursery:
            for index in range(len(prompts)):
                nursery.start_soon(run, index)
        return [r for r in results if r is not None]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(p, int) for p in items):
        return [items]  # type: ignore[list-item]  # one prompt given as token ids
    return items  # type: ignore[return-value]
