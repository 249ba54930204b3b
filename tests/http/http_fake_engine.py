"""A stand-in EngineClient for the HTTP layer's own behaviour (routing, errors, framing,
cancellation), so those tests need no model. It keeps the contract that matters here: a
request cancelled while `generate()` is suspended is recorded as aborted, exactly as the real
client aborts it in the engine, and a prompt of token ids is checked (by the real
`InputProcessor.check_request`) before `generate()` returns. Tokens are characters:
id = ord(char). With `task="embed"` it embeds instead: an input's embedding is its token ids
as floats."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import trio

from trio_llm.client.background import in_background
from trio_llm.client.confined_tokenizer import ConfinedTokenizer
from trio_llm.client.errors import EngineDeadError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.outputs import (
    CompletionOutput,
    EmbeddingOutput,
    EmbeddingRequestOutput,
    RequestMetrics,
    RequestOutput,
)
from trio_llm.sampling_params import RequestOutputKind, SamplingParams


@dataclass
class FakeEngine:
    max_model_len: int = 128
    vocab_size: int = 256
    token_interval: float = 0.0
    """Seconds between tokens (a model step)."""
    hold_after_first: bool = False
    """Block after the first token until cancelled or aborted (`abort`, which ends it with
    finish_reason 'abort'): a generation that never ends by itself."""
    die_after_first: bool = False
    finish_reason: str = "length"
    """What every choice finishes with once it has written max_tokens characters."""
    is_alive: bool = True
    task: str = "generate"
    name: str = "fake-model"
    pid: int = 0
    running: set[str] = field(default_factory=set)
    aborted: list[str] = field(default_factory=list)
    finished: list[str] = field(default_factory=list)
    prompts: dict[str, list[int]] = field(default_factory=dict)
    params: dict[str, SamplingParams] = field(default_factory=dict)
    generation_config: dict[str, Any] = field(default_factory=dict)
    """What the real client reads from the model's generation_config.json."""
    chat_template: str | None = None
    """None: a template without tools (the server renders them into the system message)."""
    unproducible_bytes: frozenset[int] = frozenset()
    """The bytes the fake vocabulary cannot write (a real engine reads them off its tokenizer)."""
    images: None = None
    """A text model: it takes no pictures (the real client's `images`)."""
    fail_with: Exception | None = None
    """Raised by every generation at its first step, as the real client raises what the engine
    reports (`UnservableRequestError`, `EngineRequestError`)."""
    outputs: list[str] | None = None
    """Scripted answers, one per choice in turn (tool-call outputs); None: the prompt echoed."""
    loras: dict[str, str] = field(default_factory=dict)
    """The LoRA adapters it serves (name -> directory), as the real client's `loras`."""
    lora_of: dict[str, str | None] = field(default_factory=dict)
    """Request id -> the adapter it was generated with."""
    priority_of: dict[str, int] = field(default_factory=dict)
    """Request id -> the scheduling priority it was sent with."""
    background_of: dict[str, bool] = field(default_factory=dict)
    """Request id -> whether it was made as background work (`client.background`)."""
    generation_prompt: str = ""
    """What the template writes after `<assistant>` (`<think>\n`: a template that opens the
    think block itself)."""
    template_kwargs: list[dict[str, Any]] = field(default_factory=list)
    """The chat_template_kwargs of each rendering, in order."""
    _changed: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    _aborts: dict[str, trio.Event] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.model_config = SimpleNamespace(
            model=self.name,
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
            dtype="float32",
            device="cpu",
            task=self.task,
            embedding_size=4 if self.task == "embed" else 0,
            normalized=False,
            block_size=16,
            num_blocks=10,
            priority_scheduling=False,
        )
        self._inputs = InputProcessor(
            ConfinedTokenizer(SimpleNamespace()),  # type: ignore[arg-type]
            max_model_len=self.max_model_len,
            vocab_size=self.vocab_size,
        )

    async def wait_for(self, predicate: Callable[[], bool]) -> None:
        while not predicate():
            await self._changed.park()

    def stats(self) -> Any:
        return SimpleNamespace(
            num_running=len(self.running),
            num_waiting=0,
            kv_usage=0.0,
            num_free_blocks=10,
            num_total_blocks=10,
            prefix_cache_queries=0,
            prefix_cache_hits=0,
            num_preemptions=0,
            num_steps=0,
            num_requests_in_flight=len(self.running),
            block_size=16,
            max_loras=0,
            running_loras=(),
            waiting_loras=(),
        )

    async def abort(self, request_id: str) -> None:
        """As the real client's: a running request ends with finish_reason 'abort'."""
        await trio.lowlevel.checkpoint()
        if request_id in self._aborts:
            self._aborts[request_id].set()

    async def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        await trio.lowlevel.checkpoint()
        return [ord(c) % self.vocab_size for c in text]

    async def decode(self, token_ids: list[int], *, skip_special_tokens: bool = True) -> str:
        await trio.lowlevel.checkpoint()
        return "".join(chr(t) for t in token_ids)

    async def vocab_tokens(self, token_ids: list[int]) -> list[str]:
        await trio.lowlevel.checkpoint()
        return [chr(t) for t in token_ids]

    def decoded_tokens(self, token_ids: list[int]) -> list[str]:
        return [chr(t) for t in token_ids]

    async def apply_chat_template(
        self,
        messages: list[dict[str, str]],
        *,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        **_: Any,
    ) -> list[int]:
        self.template_kwargs.append(dict(chat_template_kwargs or {}))
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        if add_generation_prompt:
            text += "<assistant>" + self.generation_prompt
        return await self.encode(text)

    async def embed_batch(
        self, prompts: list[str | list[int]], *, request_id: str | None = None, **_: Any
    ) -> list[EmbeddingRequestOutput]:
        outputs = []
        for prompt in prompts:
            ids = prompt if isinstance(prompt, list) else await self.encode(prompt)
            vector = np.array((ids + [0] * 4)[:4], dtype=np.float32)
            outputs.append(
                EmbeddingRequestOutput(request_id or "embd", ids, EmbeddingOutput(vector))
            )
        return outputs

    def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        lora: str | None = None,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Each choice i writes 'a', 'b', 'c', ... (shifted by i) until max_tokens (default 8);
        `lora` is recorded (`lora_of`)."""
        if request_id is not None:
            self.lora_of[request_id] = lora
            self.priority_of[request_id] = priority
            self.background_of[request_id] = in_background()
        if isinstance(prompt, list):
            self._inputs.check_request(prompt, params)
        if self.outputs is not None:
            return self._scripted(prompt, params, request_id or "req")
        return self._generate(prompt, params, request_id or "req")

    async def _scripted(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        """Choice i writes `outputs[i]` a character a step, then stops (EOS)."""
        assert self.outputs is not None
        ids = prompt if isinstance(prompt, list) else await self.encode(prompt)
        self.prompts[request_id] = ids
        self.params[request_id] = params
        texts = [self.outputs[i % len(self.outputs)] for i in range(params.n)]
        steps = max(len(t) for t in texts)
        for step in range(steps):
            await trio.lowlevel.checkpoint()
            deltas = []
            for i, text in enumerate(texts):
                if step >= len(text):
                    continue
                last = step == len(text) - 1
                deltas.append(
                    CompletionOutput(
                        index=i,
                        text=text[step],
                        token_ids=[ord(text[step]) % self.vocab_size],
                        finish_reason="stop" if last else None,
                    )
                )
            if params.output_kind is RequestOutputKind.DELTA:
                yield RequestOutput(
                    request_id,
                    None,
                    ids,
                    deltas,
                    step == steps - 1,
                    RequestMetrics(trio.current_time()),
                )
        if params.output_kind is not RequestOutputKind.DELTA:
            final = [
                CompletionOutput(i, t, [ord(c) % self.vocab_size for c in t], finish_reason="stop")
                for i, t in enumerate(texts)
            ]
            yield RequestOutput(
                request_id, None, ids, final, True, RequestMetrics(trio.current_time())
            )

    async def _generate(
        self, prompt: str | list[int], params: SamplingParams, request_id: str
    ) -> AsyncGenerator[RequestOutput, None]:
        ids = prompt if isinstance(prompt, list) else await self.encode(prompt)
        self.prompts[request_id] = ids
        self.params[request_id] = params
        total = params.max_tokens or 8
        metrics = RequestMetrics(arrival_time=trio.current_time())
        texts = [""] * params.n
        aborted = self._aborts[request_id] = trio.Event()
        self.running.add(request_id)
        self._changed.unpark_all()
        done = False
        try:
            for step in range(total):
                if self.token_interval:
                    await trio.sleep(self.token_interval)
                else:
                    await trio.lowlevel.checkpoint()
                if self.fail_with is not None:
                    raise self.fail_with
                if step == 1 and self.die_after_first:
                    raise EngineDeadError("the engine process exited (killed by the test)")
                if step == 1 and self.hold_after_first:
                    await aborted.wait()
                    delta = params.output_kind is RequestOutputKind.DELTA
                    ends = [
                        CompletionOutput(i, "" if delta else texts[i], [], finish_reason="abort")
                        for i in range(params.n)
                    ]
                    yield RequestOutput(request_id, None, ids, ends, True, metrics)
                    done = True
                    return
                now = trio.current_time()
                metrics.first_token_time = metrics.first_token_time or now
                metrics.last_token_time = now
                last = step == total - 1
                deltas = []
                for i in range(params.n):
                    char = chr(ord("a") + (step + i) % 26)
                    texts[i] += char
                    deltas.append(
                        CompletionOutput(
                            index=i,
                            text=char,
                            token_ids=[ord(char)],
                            finish_reason=self.finish_reason if last else None,
                        )
                    )
                if last:
                    metrics.finished_time = now
                if params.output_kind is RequestOutputKind.DELTA:
                    yield RequestOutput(request_id, None, ids, deltas, last, metrics)
            if params.output_kind is not RequestOutputKind.DELTA:
                final = [
                    CompletionOutput(
                        i, texts[i], [ord(c) for c in texts[i]], finish_reason=self.finish_reason
                    )
                    for i in range(params.n)
                ]
                yield RequestOutput(request_id, None, ids, final, True, metrics)
            done = True
        finally:
            del self._aborts[request_id]
            self.running.discard(request_id)
            (self.finished if done else self.aborted).append(request_id)
            self._changed.unpark_all()
