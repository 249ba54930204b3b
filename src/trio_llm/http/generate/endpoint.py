"""The request skeleton every endpoint shares, written once.

An endpoint that generates is a `GenerationEndpoint`: it plans the request (its constructor),
builds the prompts' token ids, and shapes the stream or the response. `serve_generation` does
the rest, in this order: decode the body, check the model, plan, admit, route to the model's
least-loaded engine, build the prompts, make the ids, generate, then stream or collect.
Endpoints that do not generate (models, tokenization, embeddings) use the same pieces:
`decode_body` and `json_response` (runtime/bodies.py), `AppState.admit` and `lease`.

Invariants:
- Nothing reaches the engine before every check has passed. A structured-output constraint is
  validated with the grammar library (off the event loop) right after planning. Admission
  counts the request before anything is tokenized. `generate()` checks a token-id prompt
  before it returns (the client's `check_request`: does it fit the context, are its ids and
  the params' in the vocabulary), and its errors, which name the client's fields (`prompt`,
  `max_tokens`), are renamed to the request's own (`messages`, `prompt[1]`,
  `max_completion_tokens`); they then reach the client through `translate_error` like any
  other. No generation is iterated until
  every prompt of the request has been checked.
- What a request holds (its admission ticket) is released when its ASGI call ends, however it
  ends, even if the response body was never started.
- A client that goes away cancels the request's task, and the cancellation unwinding through
  `generate()` is what aborts the request in the engine; nothing polls for disconnects, for
  streaming and non-streaming requests alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, Protocol, TypeVar

from msgspec import Struct
from quart import Response

from trio_llm.client.errors import InvalidPromptError
from trio_llm.client.input_processor import InputProcessor
from trio_llm.constraint import Constraint
from trio_llm.http.choices import Shape
from trio_llm.http.errors import bad_request
from trio_llm.http.generate.streams import Builder, collect, sse_response
from trio_llm.http.ids import engine_request_ids, new_response_id, now
from trio_llm.http.runtime.bodies import decode_body, json_response
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.http.structured import StructuredFields, constraint_of
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from trio_llm.client import EngineClient, Lease

# ---------------------------------------------------------------------------------------------
# The constraint's check


async def check_constraint(constraint: Constraint | None, param: str | None) -> None:
    """A 400 naming `param` unless the grammar engine can enforce `constraint` (validated in a
    worker thread the first time: a large schema takes a while)."""
    if constraint is None:
        return
    try:
        await InputProcessor.check_constraint(constraint)
    except SamplingParamsError as error:
        raise bad_request(f"Invalid {param}: {error}", param=param) from None


async def check_request(request: StructuredFields) -> None:
    """`check_constraint` for the constraint `request` asks for, if any."""
    found = constraint_of(request)
    if found is not None:
        await check_constraint(*found)


# ---------------------------------------------------------------------------------------------
# The skeleton


class Prompt(NamedTuple):
    token_ids: list[int]
    param: str
    """The request field it came from ("messages", "prompt", "prompt[1]"), which errors about
    the prompt name."""


@dataclass(frozen=True, slots=True)
class ResponseHead:
    """What every response and chunk of one request repeats."""

    response_id: str
    model: str
    created: int
    system_fingerprint: str | None = None


class GenerationRequest(Protocol):
    """The fields of a decoded body the skeleton reads."""

    model: str | None
    stream: bool
    request_id: str | None
    priority: int
    return_token_ids: bool

    @property
    def include_usage(self) -> bool: ...
    @property
    def continuous_usage(self) -> bool: ...


class GenerationPlan(Protocol):
    """What the skeleton reads of an endpoint's plan (plans.py)."""

    @property
    def params(self) -> SamplingParams: ...
    @property
    def max_tokens_param(self) -> str: ...
    @property
    def sequences(self) -> int: ...
    @property
    def prompt_logprobs(self) -> int | None: ...


RequestT = TypeVar("RequestT", bound=GenerationRequest)


class GenerationEndpoint(ABC, Generic[RequestT]):
    """One request to an endpoint that generates. A subclass names its request type and its
    response id's prefix, plans in its constructor (setting `plan`), and fills the three steps
    that differ between endpoints: the prompts, the stream, the response."""

    request_type: ClassVar[type[Any]]
    """A msgspec Struct with the fields of `GenerationRequest`."""
    id_prefix: ClassVar[str]
    """Of the response id, with its separator: `chatcmpl-`, `cmpl-`, `resp_`."""
    plan: GenerationPlan

    def __init__(
        self, request: RequestT, limits: RequestLimits, defaults: SamplingDefaults
    ) -> None:
        """Plan `request` within `limits`, unset sampling fields taking `defaults`: a subclass
        sets `plan`, or raises `ProtocolError`."""
        self.request = request

    def shape(self, head: ResponseHead, *, logprobs: int | None) -> Shape:
        """What the responses and chunks carry beyond the text; `logprobs`: alternatives per
        generated token (None: no logprobs)."""
        req, plan = self.request, self.plan
        return Shape(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            system_fingerprint=head.system_fingerprint,
            n=plan.params.n,
            logprobs=logprobs,
            prompt_logprobs=plan.prompt_logprobs,
            return_token_ids=req.return_token_ids,
            include_usage=req.include_usage,
            continuous_usage=req.continuous_usage,
        )

    async def check(self) -> None:
        """The checks that need the grammar library, off the event loop: a 400 unless the
        engine can enforce the request's structured-output constraint."""
        await check_request(self.request)

    @abstractmethod
    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        """The token ids of each prompt, in order (one per prompt the plan holds)."""

    @abstractmethod
    def stream(self, head: ResponseHead) -> Builder:
        """The builder of the SSE chunks, when the request streams."""

    @abstractmethod
    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> Struct:
        """The complete response from each prompt's finished output, when it does not."""


async def serve_generation(
    endpoint_type: type[GenerationEndpoint[Any]], raw: bytes | None = None
) -> Response:
    """The whole of a generating request, around the endpoint's own steps. `raw`: the body,
    when the caller has read it already."""
    state = current_state()
    body = await decode_body(endpoint_type.request_type, raw)
    _, card = state.model_for(body.model, task="generate")  # 404 or 400 before planning
    endpoint = endpoint_type(body, state.config.limits, card.sampling_defaults)
    req, plan = endpoint.request, endpoint.plan
    await endpoint.check()
    state.admit(plan.sequences)
    lease, model = state.lease(body.model, sequences=plan.sequences)
    lora = state.router.lora_for(body.model)  # a LoRA adapter named as the model
    prompts = await endpoint.prompts(lease.client, model)
    plan = endpoint.plan  # building the prompts may have added a constraint (tools)
    response_id = new_response_id(endpoint_type.id_prefix, req.request_id)
    ids = engine_request_ids(response_id, len(prompts), req.request_id is not None)
    generations = [
        _generate(lease, prompt, plan, engine_id, req.priority, lora)
        for prompt, engine_id in zip(prompts, ids, strict=True)
    ]
    head = ResponseHead(response_id, lora or model.name, now(), model.fingerprint)
    metrics = state.metrics.for_model(model.name)
    if req.stream:
        return sse_response(generations, endpoint.stream(head), metrics)
    outputs = await collect(generations, metrics)
    return json_response(endpoint.response(head, outputs))


def _generate(
    lease: Lease,
    prompt: Prompt,
    plan: GenerationPlan,
    request_id: str,
    priority: int,
    lora: str | None,
) -> AsyncGenerator[RequestOutput, None]:
    try:
        return lease.generate(
            prompt.token_ids, plan.params, request_id=request_id, priority=priority, lora=lora
        )
    except (InvalidPromptError, SamplingParamsError) as error:
        renames = {"prompt": prompt.param, "max_tokens": plan.max_tokens_param}
        error.param = renames.get(error.param, error.param)
        raise
