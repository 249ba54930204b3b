"""POST /v1/completions: text completion of one prompt or a batch of them (text or token ids),
n choices each, optionally echoing the prompt (streamed as text_completion chunks, or one
text_completion whose choice `i * n + j` is choice j of prompt i).

The request's path, top to bottom: `plan_completion` (plan.py) -> the skeleton's constraint
check and routing (generate/endpoint.py) -> `Completion.prepare` (tokenize, truncate, the echo's
texts) -> `CompletionStream` or `completion_response` (build.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from quart import Response

from trio_llm.http.choices import Shape
from trio_llm.http.completions.build import CompletionStream, completion_response
from trio_llm.http.completions.plan import CompletionPlan, plan_completion
from trio_llm.http.completions.protocol import CompletionRequest, CompletionResponse
from trio_llm.http.generate.endpoint import Prompt, serve_generation, serve_render
from trio_llm.http.ids import ResponseHead
from trio_llm.http.runtime.state import ModelInfo
from trio_llm.http.sampling import RequestLimits, SamplingDefaults, check_token_ids
from trio_llm.outputs import RequestOutput
from trio_llm.sampling_params import SamplingParams

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


@dataclass(frozen=True, slots=True)
class PreparedCompletion:
    plan: CompletionPlan
    prompts: list[Prompt]
    echo_texts: list[str] | None = None
    """With echo: each prompt as text, which its choices start with."""
    first_tokens: list[str] | None = None
    """With echo and logprobs: the text of each prompt's first token (listed in the logprobs
    with no logprob)."""

    @property
    def params(self) -> SamplingParams:
        return self.plan.params

    def shape(self, request: CompletionRequest, head: ResponseHead) -> Shape:
        return Shape.of(head, request, logprobs=self.plan.logprobs)


@dataclass(frozen=True, slots=True)
class Completion:
    """The text completion endpoint's steps (`GenerationEndpoint`)."""

    request_type: ClassVar = CompletionRequest
    id_prefix: ClassVar = "cmpl-"

    def plan(
        self, request: CompletionRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> CompletionPlan:
        return plan_completion(request, limits, defaults)

    async def prepare(
        self,
        request: CompletionRequest,
        plan: CompletionPlan,
        engine: EngineClient,
        model: ModelInfo,
    ) -> PreparedCompletion:
        given = plan.prompts
        prompts = []
        for i, prompt in enumerate(given):
            param = "prompt" if len(given) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                token_ids = await engine.encode(
                    prompt, add_special_tokens=request.add_special_tokens
                )
            else:
                check_token_ids(prompt, model.vocab_size, param)
                token_ids = prompt
            if plan.truncation is not None:
                token_ids = plan.truncation.apply(
                    token_ids, model.max_model_len, plan.params.max_tokens
                )
            prompts.append(Prompt(token_ids, param))
        if not plan.echo:
            return PreparedCompletion(plan, prompts)
        echo_texts = [  # each prompt as text, for the choices that echo it
            p
            if isinstance(p, str) and plan.truncation is None
            else await engine.decode(q.token_ids)
            for p, q in zip(given, prompts, strict=True)
        ]
        first_tokens = None
        if plan.logprobs is not None:
            first_tokens = [engine.decoded_tokens(q.token_ids[:1])[0] for q in prompts]
        return PreparedCompletion(plan, prompts, echo_texts, first_tokens)

    def stream(
        self, request: CompletionRequest, prepared: PreparedCompletion, head: ResponseHead
    ) -> CompletionStream:
        return CompletionStream(
            prepared.shape(request, head),
            echo_texts=prepared.echo_texts,
            first_tokens=prepared.first_tokens,
        )

    def response(
        self,
        request: CompletionRequest,
        prepared: PreparedCompletion,
        head: ResponseHead,
        outputs: list[RequestOutput],
    ) -> CompletionResponse:
        return completion_response(
            prepared.shape(request, head),
            outputs,
            echo_texts=prepared.echo_texts,
            first_tokens=prepared.first_tokens,
        )


async def completions(raw: bytes | None = None) -> Response:
    """`raw`: the body, when the caller has read it already (/invocations)."""
    return await serve_generation(Completion(), raw)


async def render_completion() -> Response:
    """POST /v1/completions/render: each prompt's token ids, not generated."""
    return await serve_render(Completion(), one=False)
