"""POST /invocations: the SageMaker-style route vLLM serves, one URL for the model endpoints.
A body with `messages` is a chat completion, one with `prompt` a text completion, one with
`input` an embeddings request (a classification when its model classifies rather than
embeds), one with `text_1` a score and one with `query` a rerank (as vLLM dispatches);
everything else about the request, routing by its `model` included, is that endpoint's
own."""

from __future__ import annotations

import msgspec
from quart import Response

from trio_llm.http.chat.endpoint import chat_completions
from trio_llm.http.completions.endpoint import completions
from trio_llm.http.embeddings.endpoint import embeddings
from trio_llm.http.errors import bad_request
from trio_llm.http.pooling import endpoint as pooling
from trio_llm.http.runtime.bodies import read_body
from trio_llm.http.runtime.state import current_state
from trio_llm.tasks import serves


class _Kind(msgspec.Struct):
    """Only what tells the two apart; msgspec skips the rest of the body."""

    messages: msgspec.Raw = msgspec.Raw()
    prompt: msgspec.Raw = msgspec.Raw()
    input: msgspec.Raw = msgspec.Raw()
    text_1: msgspec.Raw = msgspec.Raw()
    query: msgspec.Raw = msgspec.Raw()
    model: object = None
    """Read only to dispatch `input`; the endpoint checks its type."""


async def invocations() -> Response:
    raw = await read_body()
    try:
        kind = msgspec.json.decode(raw, type=_Kind)
    except (msgspec.DecodeError, RecursionError) as error:
        raise bad_request(f"Invalid JSON body: {error}") from None
    if kind.messages:
        return await chat_completions(raw)
    if kind.prompt:
        return await completions(raw)
    if kind.input:
        model = kind.model if isinstance(kind.model, str) else None
        _, card = current_state().model_for(model, task=None)
        if not serves(card.task, "embed") and serves(card.task, "classify"):
            return await pooling.classify(raw)
        return await embeddings(raw)
    if kind.text_1:
        return await pooling.score(raw)
    if kind.query:
        return await pooling.rerank(raw)
    raise bad_request(
        "messages: /invocations needs `messages` (a chat completion), `prompt` (a text "
        "completion), `input` (embeddings or classification), `text_1` (scores) or `query` "
        "(a rerank)",
        param="messages",
    )
