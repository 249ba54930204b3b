"""The skeleton every generating endpoint shares, written once: `serve_generation`.

An endpoint that generates is a `GenerationEndpoint`: its request type, its response id's
prefix, and four steps, each a function of values that returns the value the next one reads
(nothing is set on the side): `plan` (the decoded body -> a frozen plan, pure but for what the
endpoint was given, such as the stored responses), `prepare` (the plan and the model's engine ->
the prompts' token ids, the `SamplingParams` to generate with, and what the answer needs), then
`stream` (the SSE chunks' builder) or `response` (the complete response from the outputs).
`serve_generation` does the rest, in this order: decode the body, check the model, plan, check
the plan's constraint with the grammar library, admit, prepare (any replica tokenizes: they
share the tokenizer), route to the model's replica for that prompt (cache-aware), make the ids,
generate, then stream or collect, and settle (an endpoint's optional last step, awaited before
the response's last bytes go out: the Responses API stores the response there).
Endpoints that do not generate (models, tokenization, embeddings) use the same pieces:
`decode_body` and `json_response` (runtime/bodies.py), `AppState.admit` and `lease`.

Invariants:
- Nothing reaches the engine before every check has passed. A structured-output constraint is
  worked out once, by the plan, and validated with the grammar library (off the event loop)
  right after planning; the tools' grammar, known once the model's template is, when it is
  prepared. Admission counts the request before anything is tokenized. `generate()` checks a
  token-id prompt before it returns (the client's `check_request`: does it fit the context,
  are its ids and the params' in the vocabulary), and its errors, which name the client's
  fields (`prompt`, `max_tokens`), are renamed to the request's own (`messages`, `prompt[1]`,
  `max_completion_tokens`); they then reach the client through `translate_error` like any
  other. No generation is iterated until every prompt of the request has been checked.
- What a request holds (its admission ticket, its lease on a replica) is released when its
  ASGI call ends, however it ends, even if the response body was never started.
- A client that goes away cancels the request's task, and the cancellation unwinding through
  `generate()` is what aborts the request in the engine; nothing polls for disconnects, for
  streaming and non-streaming requests alike.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

import trio
from msgspec import Struct
from quart import Response

from trio_llm.client.errors import InvalidPromptError, UnservableRequestError
from trio_llm.client.images import ImagePrompt
from trio_llm.client.input_processor import check_constraint as client_check_constraint
from trio_llm.client.lora import routing_salt
from trio_llm.constraint import Constraint
from trio_llm.http.errors import bad_request
from trio_llm.http.generate.protocol import RenderedPrompt
from trio_llm.http.generate.streams import Builder, collect, sse_response
from trio_llm.http.ids import ResponseHead, engine_request_ids, new_response_id, now
from trio_llm.http.runtime.bodies import by_body_size, decode_body, json_response, read_body
from trio_llm.http.runtime.middleware import check_priority, header_request_id
from trio_llm.http.runtime.state import ModelInfo, current_state
from trio_llm.http.sampling import RequestLimits, SamplingDefaults
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams, SamplingParamsError

if TYPE_CHECKING:
    from trio_llm.client import EngineClient, Lease

# ---------------------------------------------------------------------------------------------
# What an endpoint gives the skeleton


class Prompt(NamedTuple):
    token_ids: list[int]
    param: str
    """The request field it came from ("messages", "prompt", "prompt[1]"), which errors about
    the prompt name."""
    images: ImagePrompt | None = None
    """The prompt with its pictures (their placeholders in `token_ids`), when it has any."""


class GenerationRequest(Protocol):
    """The fields of a decoded body the skeleton reads."""

    model: str | None
    stream: bool
    request_id: str | None
    priority: int


class GenerationPlan(Protocol):
    """What the skeleton reads of an endpoint's plan (its plan.py)."""

    @property
    def params(self) -> SamplingParams:
        """With the request's structured-output constraint, if it asks for one."""
        ...

    @property
    def constraint_param(self) -> str | None:
        """The field the constraint came from, which its errors name."""
        ...

    @property
    def max_tokens_param(self) -> str: ...
    @property
    def sequences(self) -> int:
        """What admission counts and the lease holds: every choice of every prompt."""
        ...


class Prepared(Protocol):
    """What the skeleton reads of a prepared request."""

    @property
    def prompts(self) -> list[Prompt]:
        """The token ids of each prompt, in order."""
        ...

    @property
    def params(self) -> SamplingParams:
        """What every prompt generates with: the plan's, with the tools' grammar when they
        constrain the answer."""
        ...


RequestT = TypeVar("RequestT", bound=GenerationRequest)
PlanT = TypeVar("PlanT", bound=GenerationPlan)
PreparedT = TypeVar("PreparedT", bound=Prepared)


class GenerationEndpoint(Protocol[RequestT, PlanT, PreparedT]):
    """One generating endpoint's own steps, which `serve_generation` calls in order."""

    @property
    def request_type(self) -> type[RequestT]:
        """A msgspec Struct with the fields of `GenerationRequest`."""
        ...

    @property
    def id_prefix(self) -> str:
        """Of the response id, with its separator: `chatcmpl-`, `cmpl-`, `resp_`."""
        ...

    def plan(self, request: RequestT, limits: RequestLimits, defaults: SamplingDefaults) -> PlanT:
        """`request` within `limits`, unset sampling fields taking `defaults`, or a
        `ProtocolError`."""
        ...

    async def prepare(
        self, request: RequestT, plan: PlanT, engine: EngineClient, model: ModelInfo
    ) -> PreparedT:
        """The prompts' token ids (one per prompt the plan holds) and what the answer needs."""
        ...

    def stream(self, request: RequestT, prepared: PreparedT, head: ResponseHead) -> Builder:
        """The builder of the SSE chunks, when the request streams."""
        ...

    def response(
        self,
        request: RequestT,
        prepared: PreparedT,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> Struct:
        """The complete response from each prompt's finished output, when it does not."""
        ...


# ---------------------------------------------------------------------------------------------
# The constraint's check


async def check_constraint(
    constraint: Constraint | None, param: str | None, unproducible: frozenset[int] = frozenset()
) -> None:
    """A 400 naming `param` unless the grammar engine can enforce `constraint` for a model whose
    vocabulary writes none of the bytes `unproducible` (a constraint may force one); validated
    in a worker thread the first time: a large schema takes a while."""
    if constraint is None:
        return
    try:
        await client_check_constraint(constraint, unproducible)
    except SamplingParamsError as error:
        raise bad_request(f"Invalid {param}: {error}", param=param) from None


async def check_plan(plan: GenerationPlan, model: ModelInfo) -> None:
    """`check_constraint` for the constraint the plan carries, if any, for `model`."""
    await check_constraint(plan.params.constraint, plan.constraint_param, model.unproducible_bytes)


# ---------------------------------------------------------------------------------------------
# The skeleton


async def serve_generation(
    endpoint: GenerationEndpoint[Any, Any, Any], raw: bytes | None = None
) -> Response:
    """The whole of a generating request, around the endpoint's own steps. `raw`: the body,
    when the caller has read it already."""
    state = current_state()
    if raw is None:
        raw = await read_body()
    request = await decode_body(endpoint.request_type, raw)
    check_priority(request.priority)  # 403 before anything is planned
    served, card = state.model_for(request.model, task="generate")  # 404 or 400 before planning
    limits, defaults = state.config.limits, card.sampling_defaults
    plan = await by_body_size(len(raw), endpoint.plan, request, limits, defaults)
    await check_plan(plan, card)
    state.admit(served, plan.sequences)
    prepared = await endpoint.prepare(request, plan, state.engine_for(served), card)
    lora = state.router.lora_for(request.model)  # a LoRA adapter named as the model
    lease, model = state.lease(
        request.model,
        sequences=plan.sequences,
        prompt=prepared.prompts[0].token_ids if prepared.prompts else (),
        cache_salt=routing_salt(prepared.params.cache_salt, lora),
    )
    given_id = request.request_id or header_request_id()
    response_id = new_response_id(endpoint.id_prefix, given_id)
    ids = engine_request_ids(response_id, len(prepared.prompts), given_id is not None)
    # Each prompt's own seed when the request gave none (`SamplingParams.with_seed`), so its
    # samples depend on nothing that shares its steps; reported in SEED_HEADER to replay it.
    params = [prepared.params.with_seed() for _ in prepared.prompts]
    generations = [
        _generate(lease, prompt, p, plan.max_tokens_param, engine_id, request, lora)
        for prompt, p, engine_id in zip(prepared.prompts, params, ids, strict=True)
    ]
    head = ResponseHead(response_id, lora or model.name, now(), model.fingerprint)
    metrics = state.metrics.for_model(model.name)
    settle = _settle_step(endpoint, prepared)
    drawn = _drawn_seeds(prepared.params, params)
    if request.stream:
        builder = endpoint.stream(request, prepared, head)
        streamed = sse_response(generations, builder, metrics, settle)
        streamed.headers.update(drawn)
        return streamed
    try:
        outputs = await collect(generations, metrics)
    except UnservableRequestError as error:
        if error.param == "constraint":  # the engine's name: the request's own, here
            own = prepared.params.constraint is plan.params.constraint
            error.param = plan.constraint_param if own else "tools"
        raise
    response = endpoint.response(request, prepared, head, outputs)
    await settle()
    answer = json_response(response)
    answer.headers.update(drawn)
    return answer


SEED_HEADER = "x-trio-llm-seed"
"""The seed the server drew for a sampled request that gave none (one per prompt, comma-
separated): sent back as `seed`, it replays the answer."""


def _drawn_seeds(given: SamplingParams, used: list[SamplingParams]) -> dict[str, str]:
    """SEED_HEADER for the seeds the server drew; none where the request gave its seed or
    does not sample."""
    if given.seed is not None or not used or used[0].seed is None:
        return {}
    return {SEED_HEADER: ",".join(str(p.seed) for p in used)}


def _settle_step(endpoint: Any, prepared: Any) -> Callable[[], Awaitable[None]]:
    """The endpoint's optional `settle(prepared)` step, or nothing to do."""
    settle = getattr(endpoint, "settle", None)
    if settle is None:
        return trio.lowlevel.checkpoint
    return lambda: settle(prepared)


def _generate(
    lease: Lease,
    prompt: Prompt,
    params: SamplingParams,
    max_tokens_param: str,
    request_id: str,
    request: GenerationRequest,
    lora: str | None,
) -> AsyncGenerator[RequestOutput, None]:
    try:
        return lease.generate(
            prompt.images or prompt.token_ids,
            params,
            request_id=request_id,
            priority=request.priority,
            lora=lora,
        )
    except (InvalidPromptError, SamplingParamsError) as error:
        renames = {"prompt": prompt.param, "max_tokens": max_tokens_param}
        error.param = renames.get(error.param, error.param)
        raise


_RENDERED_SAMPLING = ("n", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed")


async def serve_render(
    endpoint: GenerationEndpoint[Any, Any, Any], raw: bytes | None = None, *, one: bool
) -> Response:
    """A generating request rendered, not run: its prompts' token ids as the engine would get
    them (chat template, tools and truncation applied), checked as the request would be, but
    neither admitted nor generated. `one`: answer the first prompt as an object (chat), else
    the list of every prompt's (completions, vLLM's shape)."""
    state = current_state()
    if raw is None:
        raw = await read_body()
    request = await decode_body(endpoint.request_type, raw)
    served, card = state.model_for(request.model, task="generate")
    limits, defaults = state.config.limits, card.sampling_defaults
    plan = await by_body_size(len(raw), endpoint.plan, request, limits, defaults)
    await check_plan(plan, card)
    prepared = await endpoint.prepare(request, plan, state.engine_for(served), card)
    params = prepared.params
    sampling = {name: getattr(params, name) for name in _RENDERED_SAMPLING}
    given_id = request.request_id or header_request_id()
    response_id = new_response_id(endpoint.id_prefix, given_id)
    ids = engine_request_ids(response_id, len(prepared.prompts), False)
    rendered = [
        RenderedPrompt(
            request_id=engine_id,
            token_ids=prompt.token_ids,
            model=card.name,
            sampling_params=sampling,
            stream=request.stream,
            cache_salt=params.cache_salt,
            priority=request.priority,
        )
        for prompt, engine_id in zip(prepared.prompts, ids, strict=True)
    ]
    return json_response(rendered[0] if one else rendered)
