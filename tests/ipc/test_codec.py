"""The wire format: every engine-protocol message survives a round trip, in its direction only."""

from __future__ import annotations

import msgspec
import pytest

from trio_llm.ipc import decode_engine_message, decode_frontend_message, encode
from trio_llm.ipc.messages import (
    AbortRequests,
    EngineCoreOutput,
    EngineCoreOutputs,
    EngineCoreRequest,
    EngineFailure,
    EngineReady,
    SchedulerStats,
    Shutdown,
    TokenLogprobs,
)
from trio_llm.sampling_params import RequestOutputKind, SamplingParams

FRONTEND_MESSAGES = [
    EngineCoreRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3, 70_000],
        sampling_params=SamplingParams(
            n=2,
            max_tokens=None,
            temperature=0.7,
            seed=42,
            logit_bias={5: -100.0},
            stop=["\n\n"],
            logprobs=3,
            output_kind=RequestOutputKind.DELTA,
        ),
        arrival_time=1234.5,
        priority=-1,
    ),
    EngineCoreRequest(request_id="", prompt_token_ids=[], sampling_params=SamplingParams()),
    AbortRequests(request_ids=["a", "b"]),
    Shutdown(),
]

ENGINE_MESSAGES = [
    EngineReady(
        model="SmolLM2-135M-Instruct",
        max_model_len=8192,
        vocab_size=49152,
        eos_token_ids=[2],
        dtype="float32",
        device="cpu",
        block_size=16,
        num_blocks=512,
        kv_capacity_tokens=8192,
        kv_cache_bytes=1 << 28,
        attention_backend="triton",
        pid=4321,
    ),
    EngineCoreOutputs(
        outputs=[
            EngineCoreOutput(
                request_id="req-1",
                new_token_ids=[7, 8],
                new_logprobs=[
                    TokenLogprobs(token_ids=[7, 9], logprobs=[-0.1, -2.5], rank=1),
                    TokenLogprobs(token_ids=[8], logprobs=[-0.0]),
                ],
                prompt_logprobs=[None, TokenLogprobs(token_ids=[3], logprobs=[-1.0], rank=4)],
                num_cached_tokens=16,
            ),
            EngineCoreOutput(request_id="req-2", finish_reason="stop", stop_reason=13),
            EngineCoreOutput(request_id="req-3", finish_reason="error", error="boom"),
        ],
        timestamp=99.25,
        stats=SchedulerStats(num_running=2, kv_usage=0.5, prefix_cache_hits=16, num_steps=3),
    ),
    EngineFailure(message="CUDA out of memory", traceback="Traceback ..."),
]


@pytest.mark.parametrize("message", FRONTEND_MESSAGES, ids=lambda m: type(m).__name__)
def test_frontend_messages_round_trip(message: object) -> None:
    wire = encode(message)
    assert decode_frontend_message(wire) == message
    assert decode_frontend_message(memoryview(bytearray(wire))) == message


@pytest.mark.parametrize("message", ENGINE_MESSAGES, ids=lambda m: type(m).__name__)
def test_engine_messages_round_trip(message: object) -> None:
    wire = encode(message)
    assert decode_engine_message(wire) == message
    assert decode_engine_message(memoryview(wire)) == message


def test_a_decoder_rejects_the_other_direction() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode_engine_message(encode(Shutdown()))
    with pytest.raises(msgspec.ValidationError):
        decode_frontend_message(encode(ENGINE_MESSAGES[2]))


def test_garbage_raises_decode_error() -> None:
    with pytest.raises(msgspec.DecodeError):
        decode_frontend_message(b"\xc1not msgpack")
