"""Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, ...): protocol, options,
plan, build, models and endpoint, as every API folder."""
