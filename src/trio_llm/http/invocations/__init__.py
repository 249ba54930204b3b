"""POST /invocations: one URL dispatching to chat, completions or embeddings (endpoint.py)."""
