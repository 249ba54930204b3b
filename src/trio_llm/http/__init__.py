"""The OpenAI-compatible HTTP server: `create_app()` and `build_app()` for Hypercorn users
(`hypercorn --worker-class trio 'trio_llm.http:create_app()'`), `serve()` for `trio-llm serve`.

How it is laid out (a request for an endpoint reads top to bottom in its folder, plus the
shared pieces):
- One folder per API (`chat/`, `completions/`, `responses/`, `anthropic/`, `embeddings/`,
  `pooling/`, `models/`, `ops/`, `invocations/`, `ui/`), each with the same roles:
  `protocol.py` (the wire types, msgspec Structs, ending with the `WIRE_TYPES` /openapi.json
  shows), `plan.py` (the request -> a frozen plan: pure), `build.py` (engine outputs -> the
  response and the stream's events: pure), `endpoint.py` (the Quart handler, the only module of
  the folder that touches the app's state, and only through what it is given). A new API is a
  new folder with these roles and its lines in app.py's route table and ops/openapi.py.
- The pure shared pieces at this level (no Quart, no engine; Hypercorn's sans-I/O protocol
  layer in spirit): `wire` (field types, decoding a body), `errors` (the one error type and the
  one translation into it), `unsupported` (the one refusal list), `sampling`, `conversation`,
  `structured`, `logprobs`, `usage`, `choices`, `ids`, `sse`, `answer` (one choice's output
  read back: thinking, text, calls); `tools/` and `reasoning/` (tool calling, thinking models).
- `generate/`: the skeleton every generating endpoint shares, a function each endpoint calls
  (`serve_generation`), not a base class it inherits from; `generate/prompt.py` renders a
  conversation (chat, Responses, Messages).
- `runtime/`: what one running app holds (state, lifespan, supervisors, middleware, admission,
  metrics, JSON bodies); the app's own modules: `app`, `server`, `config` (ServerConfig),
  `serve_flags`, `engine_flags` and `flag_values` (the command line), `model_specs`,
  `hypercorn_fixes`.

The HTTP layer sees only the client (`EngineClient`, through a `Router` lease) and its outputs,
never the engine.
"""

from trio_llm.http.app import build_app, create_app
from trio_llm.http.config import ServerConfig
from trio_llm.http.errors import ProtocolError, translate_error
from trio_llm.http.runtime.state import AppState, app_state
from trio_llm.http.sampling import RequestLimits
from trio_llm.http.serve_flags import config_from_env, parse_serve_args
from trio_llm.http.server import serve

__all__ = [
    "AppState",
    "ProtocolError",
    "RequestLimits",
    "ServerConfig",
    "app_state",
    "build_app",
    "config_from_env",
    "create_app",
    "parse_serve_args",
    "serve",
    "translate_error",
]
