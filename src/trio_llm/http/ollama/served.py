"""Which served model an Ollama request names, and its body, read as Ollama reads it.

Owns the two ways Ollama's routes differ from the OpenAI ones before anything is planned: a
body is read whatever its Content-Type (Ollama's docs post with `curl -d`, a form's type), and
a model is named as served or with `:latest` added (Ollama's tags), with Ollama's 404 for a
model not served and a 400 for one that does not serve the route (generation or
embeddings). Every /api/ handler starts here.
"""

from __future__ import annotations

from quart import current_app, request
from werkzeug.exceptions import RequestEntityTooLarge

from trio_llm.client.errors import ModelNotServedError
from trio_llm.http.errors import ProtocolError, bad_request
from trio_llm.http.runtime.bodies import JSON_LIMIT_KEY
from trio_llm.http.runtime.state import AppState, ModelInfo


async def read_any_body() -> bytes:
    """The body, whatever its Content-Type (`curl -d` sends a form's), 413 past the limit."""
    limit = current_app.config.get(JSON_LIMIT_KEY)
    if limit is not None and (request.content_length or 0) > limit:
        raise RequestEntityTooLarge()
    data = await request.get_data(cache=False)
    if limit is not None and len(data) > limit:
        raise RequestEntityTooLarge()
    return data


def served_name(state: AppState, requested: str, task: str) -> tuple[str, ModelInfo]:
    """The served model a request names (as served, or with `:latest`), in Ollama's words
    when there is none (404) or it does not do `task` (400): generate, embed, or any."""
    names = state.router.names()
    name = requested
    if name not in names and name.endswith(":latest") and name.removesuffix(":latest") in names:
        name = name.removesuffix(":latest")
    try:
        state.router.model(name)
    except ModelNotServedError:
        served = ", ".join(f'"{n}"' for n in names)
        raise ProtocolError(
            404,
            f'model "{requested}" not found: this server serves {served} (models are chosen '
            "when it starts; they cannot be pulled)",
            param="model",
            code="model_not_found",
        ) from None
    _, card = state.model_for(name, task=None)
    if task != "any" and card.task != task:
        doing = {"generate": "generation", "embed": "embeddings"}[task]
        able = [f'"{c.name}"' for c in state.cards() if c.task == task]
        who = f"{', '.join(able)} does" if able else "no model does"
        raise bad_request(f'"{name}" does not support {doing}: on this server {who}', "model")
    return name, card
