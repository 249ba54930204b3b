"""POST /v1/completions: protocol.py (wire types), plan.py (request -> CompletionPlan),
build.py (outputs -> text_completion and its chunks), endpoint.py (the handler)."""
