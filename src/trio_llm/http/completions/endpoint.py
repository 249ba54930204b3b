"""POST /v1/completions: text completion of one prompt or a batch of them (text or token ids),
n choices each, optionally echoing the prompt (streamed as text_completion chunks, or one
text_completion whose choice `i * n + j` is choice j of prompt i)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response

from trio_llm.http.completions.build import CompletionStream, completion_response
from trio_llm.http.completions.plan import CompletionPlan, plan_completion
from trio_llm.http.completions.protocol import CompletionRequest, CompletionResponse
from trio_llm.http.generate.endpoint import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    serve_generation,
)
from trio_llm.http.runtime.state import ModelInfo
from trio_llm.http.sampling import RequestLimits, SamplingDefaults, check_token_ids
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class Completion(GenerationEndpoint[CompletionRequest]):
    request_type = CompletionRequest
    id_prefix = "cmpl-"
    plan: CompletionPlan

    def __init__(
        self, request: CompletionRequest, limits: RequestLimits, defaults: SamplingDefaults
    ) -> None:
        super().__init__(request, limits, defaults)
        self.plan = plan_completion(request, limits, defaults)
        self._echo_texts: list[str] | None = None
        self._first_tokens: list[str] | None = None

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        plan = self.plan
        given = plan.prompts
        prompts = []
        for i, prompt in enumerate(given):
            param = "prompt" if len(given) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                token_ids = await engine.encode(
                    prompt, add_special_tokens=self.request.add_special_tokens
                )
            else:
                check_token_ids(prompt, model.vocab_size, param)
                token_ids = prompt
            if plan.truncation is not None:
                token_ids = plan.truncation.apply(
                    token_ids, model.max_model_len, plan.params.max_tokens
                )
            prompts.append(Prompt(token_ids, param))
        if plan.echo:  # each prompt as text, for the choices that echo it
            self._echo_texts = [
                p if isinstance(p, str) and plan.truncation is None else await engine.decode(ids)
                for p, (ids, _) in zip(given, prompts, strict=True)
            ]
            if plan.logprobs is not None:
                self._first_tokens = [engine.token_texts(ids[:1])[0] for ids, _ in prompts]
        return prompts

    def stream(self, head: ResponseHead) -> CompletionStream:
        return CompletionStream(
            self.shape(head, logprobs=self.plan.logprobs),
            echo_texts=self._echo_texts,
            first_tokens=self._first_tokens,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> CompletionResponse:
        return completion_response(
            self.shape(head, logprobs=self.plan.logprobs),
            outputs,
            echo_texts=self._echo_texts,
            first_tokens=self._first_tokens,
        )


async def completions() -> Response:
    return await serve_generation(Completion)
