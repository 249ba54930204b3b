"""What each of Ollama's `options` means here: mapped onto `SamplingParams`, accepted and
ignored, or refused with a 400 naming it.

Mapped: temperature, top_p, top_k, min_p, seed, stop, presence_penalty, frequency_penalty,
repeat_penalty (llama.cpp's and vLLM's repetition penalty are the same multiplicative
penalty; here it covers the whole context, as Ollama's `repeat_last_n: -1`), repeat_last_n
(-1: the whole context, 0: no penalties at all; another window is refused while a penalty is
in force, since the penalties here do not slide), num_predict (-1 and -2: until the end of
the context or the answer, as without it), num_ctx (smaller than the served length: the
request's prompt and answer must fit in it; larger: the served length is the limit, as every
request's). Accepted and ignored, since they change how fast an answer comes and not what it
is: numa, num_batch, num_gpu, main_gpu, low_vram, f16_kv, logits_all, vocab_only, use_mmap,
use_mlock, embedding_only, num_thread, and num_keep (the context never shifts here: a prompt
that does not fit is refused) and penalize_newline (Ollama ignores it too). Refused unless
they are at the value that turns them off: mirostat (0), tfs_z and typical_p (1).

Invariant: nothing here touches Quart or the engine; every refusal names `options.<name>`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.ollama.protocol import Options

IGNORED = (
    "numa",
    "num_batch",
    "num_gpu",
    "main_gpu",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mmap",
    "use_mlock",
    "embedding_only",
    "num_thread",
    "num_keep",
    "penalize_newline",
)
"""Options that change how fast, not what (num_keep: the context never shifts here)."""

_OFF = {"mirostat": 0, "tfs_z": 1.0, "typical_p": 1.0}
"""Sampling methods this server does not build, and the value that turns each off."""


def refused(option: str, why: str) -> ProtocolError:
    param = f"options.{option}"
    return ProtocolError(400, f"{param}: {why}", param=param, code="unsupported")


@dataclass(frozen=True, slots=True)
class Sampling:
    """The options that change the output, as `SamplingParams` fields (None: the model's
    default, as for a request that leaves a field out)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int | None = None
    stop: list[str] | None = None
    max_tokens: int | None = None
    """None: until the answer ends or the context is full."""
    num_ctx: int | None = None
    """The context the request must fit in (the served one when larger: prepare's)."""


def _checked_off(options: Options) -> None:
    for name, off in _OFF.items():
        value = getattr(options, name)
        if value is not None and value != off:
            raise refused(name, f"{name} {value} is not supported by this server (only {off}, off)")


def _penalties(options: Options) -> tuple[float | None, float, float]:
    """repeat_penalty, presence_penalty, frequency_penalty, as `repeat_last_n` says."""
    repeat = options.repeat_penalty
    presence = options.presence_penalty or 0.0
    frequency = options.frequency_penalty or 0.0
    window = options.repeat_last_n
    if window == 0:  # Ollama: no window, no penalties
        return 1.0, 0.0, 0.0
    penalised = (repeat is not None and repeat != 1.0) or presence or frequency
    if window is not None and window != -1 and penalised:
        raise refused(
            "repeat_last_n",
            f"a penalty window of the last {window} tokens is not supported: the penalties "
            "here cover the whole context (repeat_last_n -1) or nothing (0)",
        )
    return repeat, presence, frequency


def _max_tokens(num_predict: int | None) -> int | None:
    if num_predict is None or num_predict in (-1, -2):
        return None
    if num_predict < 1:
        raise bad_request(
            "options.num_predict: must be at least 1, or -1 (until the answer ends) or -2 "
            f"(until the context is full); got {num_predict}",
            param="options.num_predict",
        )
    return num_predict


def _stop(stop: list[str] | str | None) -> list[str] | None:
    if stop is None:
        return None
    return [stop] if isinstance(stop, str) else list(stop)


def map_options(options: Options | None) -> Sampling:
    """The request's `options` as sampling fields, or a 400 naming the option."""
    if options is None:
        return Sampling()
    _checked_off(options)
    num_ctx = options.num_ctx
    if num_ctx is not None and num_ctx < 1:
        raise bad_request(
            f"options.num_ctx: must be at least 1, got {num_ctx}", param="options.num_ctx"
        )
    repeat, presence, frequency = _penalties(options)
    return Sampling(
        temperature=options.temperature,
        top_p=options.top_p,
        top_k=options.top_k,
        min_p=options.min_p,
        repetition_penalty=repeat,
        presence_penalty=presence,
        frequency_penalty=frequency,
        seed=options.seed,
        stop=_stop(options.stop),
        max_tokens=_max_tokens(options.num_predict),
        num_ctx=num_ctx,
    )


def options_param(param: str | None) -> str | None:
    """A `SamplingParams` field's name as the option a client set."""
    renames: dict[str, Any] = {
        "max_tokens": "options.num_predict",
        "repetition_penalty": "options.repeat_penalty",
    }
    if param is None:
        return None
    return renames.get(param, f"options.{param}")
