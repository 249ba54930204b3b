"""GET /v1/models[/{id}], POST /tokenize and /detokenize: protocol.py (wire types),
endpoint.py (the handlers)."""
