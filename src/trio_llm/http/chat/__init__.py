"""POST /v1/chat/completions: protocol.py (wire types), plan.py (request -> ChatPlan),
build.py (outputs -> chat.completion and its chunks), endpoint.py (the handler)."""
