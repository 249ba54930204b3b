"""The servers bench/serving/compare.py measures, one module per server.

Each module's `servers(args)` turns compare.py's command line into the `Server`s to run, or a
`Skipped` saying why not. A new peer is a new module here and
one line in `SERVERS`; its command line, its model name, and the serve.py flags that make
it do the common work (stop-at-EOS off) are all it has to say.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from serving.peers import llama_cpp_server, transformers_server, trio_llm_server, vllm_server
from serving.peers.base import Server, Skipped

SERVERS: dict[str, Callable[[argparse.Namespace], list[Server | Skipped]]] = {
    "trio-llm": trio_llm_server.servers,
    "transformers": transformers_server.servers,
    "llama-cpp": llama_cpp_server.servers,
    "vllm": vllm_server.servers,
}
"""--servers names -> the peer's servers."""

__all__ = ["SERVERS", "Server", "Skipped"]
