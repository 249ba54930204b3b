"""Sampling parameters: what one request asks of the sampler and of the output processor.

One type serves the public API and the wire: it is a msgspec Struct (array_like, defaults
omitted), so it crosses the process boundary inside `EngineCoreRequest` unchanged. Fields the
engine does not use (`stop`, `include_stop_str_in_output`, `skip_special_tokens`, `output_kind`)
ride along for the frontend's output processor; they cost a few bytes.

`validate()` raises `ValueError` naming the offending field; the HTTP edge turns it into a 400
with that field as the OpenAI `param`.
"""

from __future__ import annotations

import enum
import math
import random

import msgspec

from trio_llm.constraint import Constraint

MAX_LOGPROBS = 20
"""Top-N alternatives the sampler returns at most (OpenAI's own limit for top_logprobs)."""
_SEEDS = random.Random()
"""Draws the seeds of requests that sample without one (seeded from the OS at import)."""


class RequestOutputKind(enum.IntEnum):
    """How `EngineClient.generate` reports progress."""

    CUMULATIVE = 0
    """Every output carries all text and tokens so far."""
    DELTA = 1
    """Every output carries only what is new since the previous one (streaming)."""
    FINAL_ONLY = 2
    """One output, when the request finishes."""


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; `param` names it as the OpenAI API spells it."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class SamplingParams(msgspec.Struct, array_like=True, omit_defaults=True, kw_only=True):
    n: int = 1
    max_tokens: int | None = 16
    """None means: up to the model's context limit."""
    min_tokens: int = 0
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 (or -1) disables top-k."""
    min_p: float = 0.0
    seed: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None
    """Number of alternatives besides the sampled token (0..20); None: no logprobs."""
    prompt_logprobs: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    constraint: Constraint | None = None
    """Structured output: what the output must match (a JSON schema, a regex, a choice, a
    grammar); the engine masks every step's logits with it and ends the request with 'stop'
    when the grammar is complete."""
    allowed_token_ids: list[int] | None = None
    """Sample only among these tokens (vLLM's); None: all of the vocabulary."""
    bad_words: list[str] | None = None
    """Words never to generate (vLLM's): the frontend tokenizes each into
    `bad_words_token_ids`, with and without a leading space."""
    bad_words_token_ids: list[list[int]] | None = None
    """What the engine bans: a sequence's last token is masked whenever the output ends with
    the tokens before it (a one-token word is masked always). Filled from `bad_words` by the
    frontend; may also be given directly."""
    cache_salt: str | None = None
    """Prefix-cache isolation (vLLM's `cache_salt`): a request's prompt blocks are found in
    the prefix cache only by requests with the same salt, so tenants that must not learn of
    each other's prompts through cache timing give different salts. It changes no output; it
    rides here, with the request's other per-request settings, to reach the engine."""

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5

    def with_seed(self) -> SamplingParams:
        """These parameters, with a seed drawn for them when they sample without one.

        Why: the sampler keys a seeded row's draw by its seed and output position alone, while
        unseeded rows share the engine's generator, so an unseeded request's tokens would
        depend on which requests shared its steps. With a drawn seed every sampled request is
        independent of its batch, and the seed, once reported, replays it."""
        if self.seed is not None or self.greedy:
            return self
        return msgspec.structs.replace(self, seed=_SEEDS.getrandbits(62))

    def validate(self) -> None:
        def need(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise SamplingParamsError(param, message)

        for name in (
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        ):
            value = getattr(self, name)
            need(math.isfinite(value), name, f"{name} must be a finite number, got {value}")
        need(self.n >= 1, "n", f"n must be at least 1, got {self.n}")
        need(
            self.max_tokens is None or self.max_tokens >= 1,
            "max_tokens",
            f"max_tokens must be at least 1, got {self.max_tokens}",
        )
        need(self.min_tokens >= 0, "min_tokens", f"min_tokens must be >= 0, got {self.min_tokens}")
        need(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            "min_tokens",
            f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})",
        )
        need(
            0.0 <= self.temperature <= 100.0,
            "temperature",
            f"temperature must be in [0, 100], got {self.temperature}",
        )
        need(0.0 < self.top_p <= 1.0, "top_p", f"top_p must be in (0, 1], got {self.top_p}")
        need(self.top_k >= -1, "top_k", f"top_k must be -1, 0 or positive, got {self.top_k}")
        need(0.0 <= self.min_p <= 1.0, "min_p", f"min_p must be in [0, 1], got {self.min_p}")
        need(
            -2.0 <= self.presence_penalty <= 2.0,
            "presence_penalty",
            f"presence_penalty must be in [-2, 2], got {self.presence_penalty}",
        )
        need(
            -2.0 <= self.frequency_penalty <= 2.0,
            "frequency_penalty",
            f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}",
        )
        need(
            0.0 < self.repetition_penalty <= 2.0,
            "repetition_penalty",
            f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            need(
                value is None or 0 <= value <= MAX_LOGPROBS,
                name,
                f"{name} must be between 0 and {MAX_LOGPROBS}, got {value}",
            )
        if self.logit_bias:
            # Every bad entry is named, not the first only (vLLM names them all).
            bad = {
                token: bias
                for token, bias in self.logit_bias.items()
                if not (math.isfinite(bias) and -100.0 <= bias <= 100.0)
            }
            need(
                not bad,
                "logit_bias",
                "logit_bias values must be in [-100, 100], got "
                + ", ".join(f"{bias} for token {token}" for token, bias in bad.items()),
            )
        need(
            all(t >= 0 for t in self.stop_token_ids),
            "stop_token_ids",
            "stop_token_ids must be non-negative token ids",
        )
        need(all(s for s in self.stop), "stop", "stop strings must not be empty")
        if self.constraint is not None:
            try:
                self.constraint.validate()
            except ValueError as error:
                raise SamplingParamsError("constraint", str(error)) from None
        need(
            self.allowed_token_ids is None or len(self.allowed_token_ids) > 0,
            "allowed_token_ids",
            "allowed_token_ids must not be empty",
        )
        need(all(self.bad_words or ()), "bad_words", "bad_words must not be empty strings")
        need(
            all(self.bad_words_token_ids or ()),
            "bad_words",
            "bad_words_token_ids must not hold an empty sequence",
        )
        need(
            self.cache_salt is None or self.cache_salt != "",
            "cache_salt",
            "cache_salt must be a non-empty string when given",
        )

    def validate_vocab(self, vocab_size: int) -> None:
        """Token ids the request names must exist in the model's vocabulary."""
        bad_words = [t for word in self.bad_words_token_ids or () for t in word]
        for param, ids in (
            ("logit_bias", self.logit_bias or ()),
            ("stop_token_ids", self.stop_token_ids),
            ("allowed_token_ids", self.allowed_token_ids or ()),
            ("bad_words", bad_words),
        ):
            outside = sorted({t for t in ids if not 0 <= t < vocab_size})
            if outside:  # all of them, in vLLM's words
                raise SamplingParamsError(
                    param,
                    f"token_id(s) {outside} in {param} contain out-of-vocab token ids. "
                    f"Vocabulary size: {vocab_size}",
                )
