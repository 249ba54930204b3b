"""`trio-llm chat`'s command: its flags, the backend it opens, and the read loop on the main
thread (readline for line editing and a history kept between sessions).

Invariant: Ctrl-C at the prompt clears the line; Ctrl-D or /exit leaves, and the backend is
closed however the loop ends.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from trio_llm.chat.backends import (
    TEMPERATURE,
    Backend,
    ChatError,
    EngineBackend,
    HttpBackend,
    Options,
)
from trio_llm.chat.conversation import Chat, Terminal


def add_chat_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "model",
        nargs="?",
        help="run this model in this process (default: the default model), unless --url is given",
    )
    parser.add_argument(
        "--url", help="talk to the server running there instead, e.g. http://127.0.0.1:8000"
    )
    parser.add_argument(
        "--api-key",
        default=os.environ.get("TRIO_LLM_API_KEY"),
        help="the server's key, with --url (default: $TRIO_LLM_API_KEY)",
    )
    parser.add_argument("--model", dest="served_model", help="with --url: which served model")
    parser.add_argument("--system", help="the system prompt to start with")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE)
    parser.add_argument("--max-tokens", type=int, help="per reply (default: to the context's end)")
    engine = parser.add_argument_group("the in-process engine (without --url)")
    engine.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    engine.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    engine.add_argument("--max-model-len", type=int, help="context length (default: the model's)")
    engine.add_argument("--kv-cache-memory", default="1GiB", help="e.g. 512MiB (default 1GiB)")
    engine.add_argument("--num-threads", type=int, help="torch threads (default: one per core)")


def run(args: argparse.Namespace) -> int:
    if args.url and args.model:
        print("trio-llm chat: give a MODEL or --url, not both", file=sys.stderr)
        return 2
    terminal = Terminal()
    try:
        backend = _open_backend(args, terminal)
    except ChatError as error:
        print(f"trio-llm chat: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    try:
        chat = Chat(backend, Options(args.temperature, args.max_tokens), terminal, args.system)
        terminal.note(
            f"chatting with {backend.model} ({backend.where}); /help for commands, "
            "Ctrl-C stops a reply, Ctrl-D leaves"
        )
        with _history():
            _loop(chat)
    finally:
        backend.close()
    return 0


def _open_backend(args: argparse.Namespace, terminal: Terminal) -> Backend:
    if args.url:
        return HttpBackend(args.url, api_key=args.api_key, model=args.served_model)
    from trio_llm.client import EngineStartError

    terminal.note(f"starting the engine for {args.model or 'the default model'}...")
    engine_args = {
        "dtype": args.dtype,
        "device": args.device,
        "max_model_len": args.max_model_len,
        "kv_cache_memory": args.kv_cache_memory,
        "num_threads": args.num_threads,
    }
    try:
        return EngineBackend(args.model, engine_args)
    except EngineStartError as error:
        raise ChatError(str(error)) from None


def _loop(chat: Chat) -> None:
    while True:
        try:
            line = input(">>> ").strip()
        except EOFError:
            chat.terminal.write("\n")
            return
        except KeyboardInterrupt:
            chat.terminal.write("\n")
            chat.terminal.note("(Ctrl-D or /exit leaves)")
            continue
        if not line:
            continue
        if line.startswith("/"):
            if not chat.command(line):
                return
            continue
        chat.reply(line)


@contextlib.contextmanager
def _history() -> Iterator[None]:
    """Line editing, and the history kept in $XDG_STATE_HOME/trio-llm/chat_history."""
    try:
        import readline
    except ImportError:  # not on every platform; input() still works without it
        yield
        return
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    path = Path(state) / "trio-llm" / "chat_history"
    with contextlib.suppress(OSError):
        readline.read_history_file(path)
    readline.set_history_length(1000)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(path)
