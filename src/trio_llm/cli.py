"""The `trio-llm` command: `trio-llm serve [MODEL] [flags]`, `trio-llm chat [--url URL | MODEL]`
and `trio-llm run-batch -i IN -o OUT [--model MODEL]`.

Owns argv only: it parses, sets up logging, and hands a checked `ServerConfig` to the server;
the serve flags themselves are defined once, in `trio_llm.http.serve_flags`, the chat's in
`trio_llm.chat`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from trio_llm import __version__


def build_parser() -> argparse.ArgumentParser:
    from trio_llm.chat import add_chat_arguments
    from trio_llm.http.serve_flags import add_serve_arguments

    parser = argparse.ArgumentParser(
        prog="trio-llm", description="An OpenAI-compatible LLM server on structured concurrency."
    )
    parser.add_argument("--version", action="version", version=f"trio-llm {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="serve a model over the OpenAI API (HTTP/1.1 and HTTP/2)",
        description="Serve a model over the OpenAI API. Every flag also reads its default "
        "from the environment as TRIO_LLM_<FLAG>, e.g. TRIO_LLM_API_KEY.",
    )
    add_serve_arguments(serve)
    chat = commands.add_parser(
        "chat",
        help="chat in the terminal, with a running server (--url) or a model run in-process",
        description="Chat in the terminal: with the server at --url, or with MODEL run in this "
        "process (no server). Replies stream as they are written; Ctrl-C stops one.",
    )
    add_chat_arguments(chat)
    from trio_llm.http.batch.run_batch import add_run_batch_arguments

    run_batch = commands.add_parser(
        "run-batch",
        help="run a batch file (OpenAI's batch JSONL) with the model in-process, no server",
        description="Answer every line of a batch input file (OpenAI's batch format, as "
        "vLLM's run-batch reads it) with the model run in this process, and write OpenAI's "
        "batch output lines.",
    )
    add_run_batch_arguments(run_batch)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "serve":
        from trio_llm.triton_absent import mark_triton_absent

        mark_triton_absent()  # before anything imports torch: the frontend runs no kernels
        from trio_llm.http.config import config_from_args
        from trio_llm.http.server import run

        try:
            config = config_from_args(args)
        except ValueError as error:
            parser.error(str(error))
        return run(config)
    if args.command == "run-batch":
        from pathlib import Path

        from trio_llm.http.batch import run_batch as batch

        try:
            config = batch.config_of(args)
        except ValueError as error:
            parser.error(str(error))
        return batch.run(config, Path(args.input_file), Path(args.output_file))
    if args.command == "chat":
        from trio_llm import chat

        return chat.run(args)
    parser.error(f"unknown command {args.command}")
    return 2
