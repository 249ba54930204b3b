"""Admission: what a request must satisfy to enter the engine, and the sequence it becomes.

Why a module of its own: every limit a request meets at the door is here in one reading (its
kind against the engine's task, its sampling parameters, its prompt against the vocabulary and
the context, its priority against the scheduling policy, its adapter against those served),
and each refusal is a `RequestError` whose message the user reads. EngineCore turns one into
an 'error' output for that request alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

import torch

from trio_llm.engine.lora import LoraNotFoundError, LoraRegistry, adapter_root
from trio_llm.engine.models.vision import VisionEncoder
from trio_llm.engine.step.block_manager import salt_root
from trio_llm.engine.step.images import ImageError, slots_of
from trio_llm.engine.step.sequence import Sequence
from trio_llm.engine.step.token_bans import TokenBans
from trio_llm.ipc.messages import EngineCoreRequest
from trio_llm.tasks import TASK_WORDS, is_pooling


class RequestError(ValueError):
    """A request the engine cannot serve; it finishes with an 'error' output."""


@dataclass(slots=True)
class Admission:
    """The engine's limits for one request, fixed at start-up (the served adapters change)."""

    task: str
    vocab_size: int
    max_model_len: int
    device: torch.device
    priority_scheduling: bool
    loras: LoraRegistry | None
    vision: VisionEncoder | None = None
    """A vision-language model's tower (None: the model takes no images)."""
    arrivals: Iterator[int] = field(default_factory=itertools.count)
    """Arrival order, for first come, first served among equals."""

    @property
    def pooling(self) -> bool:
        return is_pooling(self.task)

    def sequence(self, req: EngineCoreRequest, running: Container[str]) -> Sequence:
        """`req` as a sequence ready to schedule; raises RequestError with the reason it
        cannot be served (`running`: the ids of requests already in the engine)."""
        params = req.sampling_params
        if req.pooling != self.pooling:
            raise RequestError(
                f"this engine serves {TASK_WORDS[self.task]}, not generation"
                if self.pooling
                else "this engine serves generation, not pooled outputs"
            )
        if not self.pooling:
            params.validate()
            params.validate_vocab(self.vocab_size)
        prompt = req.prompt_token_ids
        if req.request_id in running:
            raise RequestError(f"request id {req.request_id!r} is already running")
        if not prompt:
            raise RequestError("the prompt is empty")
        if min(prompt) < 0 or max(prompt) >= self.vocab_size:
            raise RequestError(f"the prompt has token ids outside [0, {self.vocab_size})")
        if self.pooling and len(prompt) > self.max_model_len:
            raise RequestError(
                f"the input has {len(prompt)} tokens, but this model takes at most "
                f"{self.max_model_len}"
            )
        if not 0 <= req.token_type_start < len(prompt):
            raise RequestError(
                f"token_type_start {req.token_type_start} is outside the prompt's "
                f"{len(prompt)} tokens"
            )
        if not self.pooling and len(prompt) >= self.max_model_len:
            raise RequestError(
                f"the prompt has {len(prompt)} tokens, but this model's context holds "
                f"{self.max_model_len} (prompt and at least one output token)"
            )
        room = self.max_model_len - len(prompt)
        seq = Sequence(
            request_id=req.request_id,
            token_ids=list(prompt),
            params=params,
            max_tokens=room if params.max_tokens is None else min(params.max_tokens, room),
            priority=req.priority,
            arrival=next(self.arrivals),
            background=req.background,
            cache_root=salt_root(params.cache_salt),
        )
        if req.priority and not self.priority_scheduling:
            raise RequestError(
                "priority is honoured only with scheduling_policy 'priority' "
                "(--scheduling-policy priority); this engine schedules fcfs"
            )
        if req.lora is not None:
            if self.loras is None:
                raise RequestError("LoRA adapters are not enabled on this engine")
            try:
                adapter = self.loras.lookup(req.lora)
            except LoraNotFoundError as error:
                raise RequestError(str(error)) from None
            seq.lora_slot = adapter.slot
            seq.adapter = (adapter.load_id, adapter.name)
            seq.cache_root = adapter_root(adapter.load_id, seq.cache_root)
        if req.images:
            try:
                seq.images = slots_of(req.images, prompt, self.vision)
            except ImageError as error:
                raise RequestError(str(error)) from None
        if self.pooling:
            seq.token_type_start = req.token_type_start
            return seq
        if params.prompt_logprobs is not None:
            seq.prompt_logprobs = [None]
        seq.bans = TokenBans.build(params, self.vocab_size, self.device)
        return seq
