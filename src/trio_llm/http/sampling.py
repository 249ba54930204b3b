"""The sampling fields chat and text completions share, and what they mean for the engine.

Owns the fields' wire types (`SamplingFields`, OpenAI's then vLLM's; the structured-output
ones are structured.py's), the limits a request may not pass (`RequestLimits`), the defaults
of fields a request leaves unset (`SamplingDefaults`, from the model's generation_config.json),
prompt truncation (`Truncation`), OpenAI's four prompt forms (`prompt_forms`), and the fields
turned into one checked `SamplingParams` (`sampling_params`). What needs the prompt's tokens
(does it fit the context, are its token ids in the vocabulary) is the client's
`InputProcessor.check_request`, which `generate()` runs. Invariant: every way the fields can
be wrong ends in a `ProtocolError` naming the parameter, and nothing here touches Quart or the
engine, so all of it is tested with plain values.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from msgspec import Meta, Struct

from trio_llm.http.errors import bad_request
from trio_llm.http.structured import StructuredFields, constraint_of
from trio_llm.http.wire import (
    Int32,
    Int64,
    NonNegativeInt,
    PositiveInt,
    RequestId,
    TokenId,
    TopLogprobs,
)
from trio_llm.sampling_params import RequestOutputKind, SamplingParams, SamplingParamsError

log = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# The fields


class StreamOptions(Struct, kw_only=True):
    include_usage: bool = False
    continuous_usage_stats: bool = False
    """vLLM's: with include_usage, every chunk carries the usage so far."""


class SamplingFields(StructuredFields, kw_only=True):
    """Fields /v1/chat/completions and /v1/completions share (OpenAI's, then vLLM's; the
    structured-output ones are http/structured.py's). Those that would change the output but
    are not built yet are refused by unsupported.py."""

    refuses_unbuilt: ClassVar[bool] = True
    """`decode_request` refuses the known fields not built yet (unsupported.py)."""
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: PositiveInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: Int64 | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[TokenId, float] | None = None
    user: str | None = None
    # vLLM's extensions, same names and meaning.
    top_k: Int32 | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: NonNegativeInt = 0
    ignore_eos: bool = False
    stop_token_ids: list[TokenId] | None = None
    bad_words: list[str] | None = None
    allowed_token_ids: list[TokenId] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: Annotated[int, Meta(ge=-1, le=2**31 - 1)] | None = None
    """Keep this many prompt tokens (-1: as many as fit the context beside max_tokens)."""
    truncation_side: Literal["left", "right"] | None = None
    """`left` (the default) drops the prompt's start and keeps its last tokens."""
    prompt_logprobs: TopLogprobs | None = None
    return_token_ids: bool = False
    priority: Int32 = 0
    request_id: RequestId | None = None
    cache_salt: str | None = None
    """vLLM's per-tenant prefix-cache isolation: prompts match cached blocks only of
    requests with the same salt."""

    @property
    def include_usage(self) -> bool:
        return self.stream and self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk (vLLM's `continuous_usage_stats`, which needs include_usage)."""
        return self.include_usage and self.stream_options.continuous_usage_stats  # type: ignore[union-attr]


# ---------------------------------------------------------------------------------------------
# What they mean


class OneSequence:
    """What admission counts of a plan (`GenerationPlan.sequences`) for an API that answers
    with one sequence (Responses, Messages). A mixin of the plan's dataclass."""

    __slots__ = ()

    @property
    def sequences(self) -> int:
        return 1


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """What one request may ask for; each is checked before the engine sees the request."""

    max_n: int = 16
    max_prompts: int = 16
    """Prompts in one /v1/completions batch."""
    max_embedding_inputs: int = 2048
    """Inputs in one /v1/embeddings request (OpenAI's own limit)."""
    max_stop: int = 16
    max_stop_length: int = 512
    max_logit_bias: int = 300
    max_bad_words: int = 128
    max_allowed_token_ids: int = 1 << 20


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """What a request that leaves a sampling field unset gets: OpenAI's defaults, or the
    model's own recommendation (its generation_config.json, `--generation-config auto`)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any]) -> SamplingDefaults:
        """The fields of a generation_config.json that vLLM's `auto` reads (do_sample is not
        consulted, as vLLM does not). A value a request could not have set (a string, a
        top_p of 0) is left out, with a warning."""
        given: dict[str, Any] = {}
        for name in cls.__slots__:  # type: ignore[attr-defined]
            value = config.get(name)
            if value is None:
                continue
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            try:
                if not numeric or (name == "top_k" and not isinstance(value, int)):
                    raise SamplingParamsError(name, f"{name} is {value!r}, not a number")
                SamplingParams(**{name: value}).validate()
            except SamplingParamsError as error:
                log.warning("generation config: ignoring %s: %s", name, error)
                continue
            given[name] = value
        return cls(**given)

    def fill(
        self,
        *,
        temperature: float | None,
        top_p: float | None,
        top_k: int | None,
        min_p: float | None,
        repetition_penalty: float | None,
    ) -> dict[str, Any]:
        """These fields as a request gave them, each one it left unset (None) taking its
        default: `SamplingParams` keyword arguments."""
        given = {
            "temperature": temperature,
            "top_p": top_p,
            "top_k": top_k,
            "min_p": min_p,
            "repetition_penalty": repetition_penalty,
        }
        return {k: getattr(self, k) if v is None else v for k, v in given.items()}

    def overrides(self) -> dict[str, float]:
        """The fields that differ from OpenAI's defaults."""
        base = SamplingDefaults()
        return {
            name: getattr(self, name)
            for name in self.__slots__  # type: ignore[attr-defined]
            if getattr(self, name) != getattr(base, name)
        }


OPENAI_DEFAULTS = SamplingDefaults()
"""What a request gets when the model recommends nothing (or `--generation-config none`)."""


@dataclass(frozen=True, slots=True)
class Truncation:
    """vLLM's truncate_prompt_tokens and truncation_side: how many prompt tokens to keep."""

    keep: int
    """-1: as many as the context holds beside max_tokens."""
    side: str = "left"
    """`left` drops the start of the prompt (keeps its last tokens), `right` its end."""

    def apply(self, token_ids: list[int], max_model_len: int, max_tokens: int | None) -> list[int]:
        room = max_model_len - (max_tokens or 1)
        keep = room if self.keep == -1 else self.keep
        if keep > room:
            raise bad_request(
                f"truncate_prompt_tokens: {keep} is more than the context leaves for the prompt "
                f"beside max_tokens ({max_model_len} - {max_tokens or 1} = {room})",
                param="truncate_prompt_tokens",
            )
        if len(token_ids) <= keep:
            return token_ids
        return token_ids[-keep:] if self.side == "left" else token_ids[:keep]


def truncation(request: SamplingFields) -> Truncation | None:
    keep = request.truncate_prompt_tokens
    if keep is None:
        return None
    if keep == 0:
        raise bad_request(
            "truncate_prompt_tokens: must be -1 or at least 1", param="truncate_prompt_tokens"
        )
    return Truncation(keep, request.truncation_side or "left")


def prompt_forms(
    given: str | list[str | int | list[int]], param: str, max_count: int
) -> list[str | list[int]]:
    """The four forms OpenAI accepts for a completion's `prompt` and an embedding's `input`,
    as a list of at most `max_count`, none empty."""
    prompts: list[str | list[int]]
    if isinstance(given, str):
        prompts = [given]
    elif not given:
        raise bad_request(f"{param} must not be empty", param=param)
    elif all(isinstance(p, int) for p in given):
        prompts = [list(given)]  # type: ignore[arg-type]
    elif all(isinstance(p, str) for p in given) or all(isinstance(p, list) for p in given):
        prompts = list(given)  # type: ignore[arg-type]
    else:
        raise bad_request(
            f"{param} must be a string, a list of strings, a list of token ids, or a list of "
            "lists of token ids (not a mixture)",
            param=param,
        )
    if len(prompts) > max_count:
        raise bad_request(
            f"at most {max_count} {param}s per request, got {len(prompts)}", param=param
        )
    for i, p in enumerate(prompts):
        if len(p) == 0:
            where = param if len(prompts) == 1 else f"{param}[{i}]"
            raise bad_request(f"{where} must not be empty", param=where)
    return prompts


def check_token_ids(token_ids: list[int], vocab_size: int, param: str) -> None:
    for token in token_ids:
        if token >= vocab_size:
            raise bad_request(
                f"{param} contains token id {token}, outside the vocabulary (size {vocab_size})",
                param=param,
            )


def stop_list(stop: str | list[str] | None, limits: RequestLimits) -> list[str]:
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    if len(stops) > limits.max_stop:
        raise bad_request(f"at most {limits.max_stop} stop sequences, got {len(stops)}", "stop")
    for s in stops:
        if not s:
            raise bad_request("stop sequences must not be empty", param="stop")
        if len(s) > limits.max_stop_length:
            raise bad_request(
                f"a stop sequence may have at most {limits.max_stop_length} characters, "
                f"got {len(s)}",
                param="stop",
            )
    return stops


def check_fields(request: SamplingFields, limits: RequestLimits) -> None:
    """What the fields of both endpoints must satisfy beyond their types."""
    if request.stream_options is not None and not request.stream:
        raise bad_request(
            "stream_options: only allowed when stream is true", param="stream_options"
        )
    if request.prompt_logprobs is not None and request.stream:
        raise bad_request(
            "prompt_logprobs: not available when stream is true", param="prompt_logprobs"
        )
    if request.n > limits.max_n:
        raise bad_request(f"n must be at most {limits.max_n}, got {request.n}", param="n")
    if request.logit_bias and len(request.logit_bias) > limits.max_logit_bias:
        raise bad_request(
            f"logit_bias may have at most {limits.max_logit_bias} entries, "
            f"got {len(request.logit_bias)}",
            param="logit_bias",
        )
    bad_words = request.bad_words or ()
    if len(bad_words) > limits.max_bad_words:
        raise bad_request(
            f"bad_words: at most {limits.max_bad_words} words, got {len(bad_words)}",
            param="bad_words",
        )
    if any(len(word) > limits.max_stop_length for word in bad_words):
        raise bad_request(
            f"bad_words: a word may have at most {limits.max_stop_length} characters",
            param="bad_words",
        )
    allowed = request.allowed_token_ids
    if allowed is not None and len(allowed) > limits.max_allowed_token_ids:
        raise bad_request(
            f"allowed_token_ids: at most {limits.max_allowed_token_ids} ids, got {len(allowed)}",
            param="allowed_token_ids",
        )


def sampling_params(
    request: SamplingFields,
    limits: RequestLimits,
    defaults: SamplingDefaults,
    *,
    max_tokens: int | None,
    logprobs: int | None,
    prompt_logprobs: int | None,
    renames: dict[str, str],
) -> tuple[SamplingParams, str | None]:
    """The request's `SamplingParams` (its structured-output constraint worked out here, once)
    and the field that constraint came from (None without one)."""
    check_fields(request, limits)
    constraint = constraint_of(request)
    params = SamplingParams(
        n=request.n,
        max_tokens=max_tokens,
        min_tokens=request.min_tokens,
        **defaults.fill(
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            min_p=request.min_p,
            repetition_penalty=request.repetition_penalty,
        ),
        seed=request.seed,
        presence_penalty=0.0 if request.presence_penalty is None else request.presence_penalty,
        frequency_penalty=0.0 if request.frequency_penalty is None else request.frequency_penalty,
        logit_bias=dict(request.logit_bias) if request.logit_bias else None,
        stop=stop_list(request.stop, limits),
        stop_token_ids=list(request.stop_token_ids or ()),
        bad_words=list(request.bad_words) if request.bad_words else None,
        allowed_token_ids=(
            None if request.allowed_token_ids is None else list(request.allowed_token_ids)
        ),
        ignore_eos=request.ignore_eos,
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=request.skip_special_tokens,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
        output_kind=RequestOutputKind.DELTA if request.stream else RequestOutputKind.FINAL_ONLY,
        constraint=None if constraint is None else constraint[0],
        cache_salt=request.cache_salt,
    )
    try:
        params.validate()
    except SamplingParamsError as error:
        raise bad_request(str(error), param=renames.get(error.param, error.param)) from None
    return params, None if constraint is None else constraint[1]
