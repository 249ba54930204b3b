"""Ollama's API under /api/ (chat, generate, embed, embeddings, tags, show, ps, version; the
model management routes refused): protocol, options, plan, build and endpoint as every API
folder, plus served.py (bodies and model names), embed.py and models.py. The handlers are
re-exported here for the app's route table."""

from trio_llm.http.ollama.embed import api_embed, api_embeddings
from trio_llm.http.ollama.endpoint import api_chat, api_generate
from trio_llm.http.ollama.models import (
    api_blobs,
    api_copy,
    api_create,
    api_delete,
    api_ps,
    api_pull,
    api_push,
    api_show,
    api_tags,
    api_version,
)

__all__ = [
    "api_blobs",
    "api_chat",
    "api_copy",
    "api_create",
    "api_delete",
    "api_embed",
    "api_embeddings",
    "api_generate",
    "api_ps",
    "api_pull",
    "api_push",
    "api_show",
    "api_tags",
    "api_version",
]
