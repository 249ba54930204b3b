"""POST /invocations: the SageMaker-style route vLLM serves, one URL for the model endpoints.
A body with `messages` is a chat completion, one with `prompt` a text completion, one with
`input` an embeddings request (as vLLM dispatches); everything else about the request,
routing by its `model` included, is that endpoint's own."""

from __future__ import annotations

import msgspec
from quart import Response

from trio_llm.http.chat.endpoint import ChatCompletion
from trio_llm.http.completions.endpoint import Completion
from trio_llm.http.embeddings.endpoint import embeddings
from trio_llm.http.errors import bad_request
from trio_llm.http.generate.endpoint import serve_generation
from trio_llm.http.runtime.bodies import read_body


class _Kind(msgspec.Struct):
    """Only what tells the two apart; msgspec skips the rest of the body."""

    messages: msgspec.Raw = msgspec.Raw()
    prompt: msgspec.Raw = msgspec.Raw()
    input: msgspec.Raw = msgspec.Raw()


async def invocations() -> Response:
    raw = await read_body()
    try:
        kind = msgspec.json.decode(raw, type=_Kind)
    except (msgspec.DecodeError, RecursionError) as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    if kind.messages:
        return await serve_generation(ChatCompletion, raw)
    if kind.prompt:
        return await serve_generation(Completion, raw)
    if kind.input:
        return await embeddings(raw)
    raise bad_request(
        "messages: /invocations needs `messages` (a chat completion), `prompt` (a text "
        "completion) or `input` (embeddings)",
        param="messages",
    )
