"""The OpenAI-compatible HTTP server: `create_app()` and `build_app()` for Hypercorn users
(`hypercorn --worker-class trio 'trio_llm.http:create_app()'`), `serve()` for `trio-llm serve`.
"""

from trio_llm.http.app import build_app, create_app
from trio_llm.http.config import ServerConfig, config_from_env, parse_serve_args
from trio_llm.http.errors import ProtocolError, translate_error
from trio_llm.http.runtime.state import AppState, app_state
from trio_llm.http.sampling import RequestLimits
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
