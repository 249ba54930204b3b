"""POST /v1/completions: text completion of one prompt or a batch of them (text or token ids),
n choices each, optionally echoing the prompt (streamed as text_completion chunks, or one
text_completion whose choice `i * n + j` is choice j of prompt i)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quart import Response

from trio_llm.http.builders import CompletionStream, completion_response
from trio_llm.http.plans import CompletionPlan, RequestLimits, check_token_ids, plan_completion
from trio_llm.http.protocol import CompletionRequest
from trio_llm.http.responses import CompletionResponse
from trio_llm.http.serving import (
    GenerationEndpoint,
    Prompt,
    ResponseHead,
    serve_generation,
)
from trio_llm.http.state import ModelInfo
from trio_llm.outputs import RequestOutput

if TYPE_CHECKING:
    from trio_llm.client import EngineClient


class Completion(GenerationEndpoint[CompletionRequest]):
    request_type = CompletionRequest
    id_prefix = "cmpl"
    plan: CompletionPlan

    def __init__(self, request: CompletionRequest, limits: RequestLimits) -> None:
        super().__init__(request, limits)
        self.plan = plan_completion(request, limits)
        self._echo_texts: list[str] | None = None

    async def prompts(self, engine: EngineClient, model: ModelInfo) -> list[Prompt]:
        given = self.plan.prompts
        prompts = []
        for i, prompt in enumerate(given):
            param = "prompt" if len(given) == 1 else f"prompt[{i}]"
            if isinstance(prompt, str):
                token_ids = await engine.encode(prompt)
            else:
                check_token_ids(prompt, model.vocab_size, param)
                token_ids = prompt
            prompts.append(Prompt(token_ids, param))
        if self.plan.echo:  # each prompt as text, for the choices that echo it
            self._echo_texts = [p if isinstance(p, str) else await engine.decode(p) for p in given]
        return prompts

    def stream(self, head: ResponseHead) -> CompletionStream:
        return CompletionStream(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            n=self.plan.params.n,
            logprobs=self.plan.logprobs,
            include_usage=self.request.include_usage,
            echo_texts=self._echo_texts,
        )

    def response(self, head: ResponseHead, outputs: list[RequestOutput]) -> CompletionResponse:
        return completion_response(
            response_id=head.response_id,
            model=head.model,
            created=head.created,
            outputs=outputs,
            n=self.plan.params.n,
            logprobs=self.plan.logprobs,
            echo_texts=self._echo_texts,
        )


async def completions() -> Response:
    return await serve_generation(Completion)
