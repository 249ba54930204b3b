"""The skeleton every generating endpoint shares: endpoint.py (GenerationEndpoint and
serve_generation: decode, plan, check, admit, route, prepare, generate, answer) and streams.py
(a request's generations fanned in, collected or framed as server-sent events); prompt.py (a
conversation rendered into a prompt, the step chat, Responses and Messages share in `prepare`)."""
