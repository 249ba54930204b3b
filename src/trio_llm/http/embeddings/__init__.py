"""POST /v1/embeddings: protocol.py (wire types), endpoint.py (plan and handler)."""
