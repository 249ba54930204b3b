"""Serving benchmark against peers, side by side in one run: trio-llm, `transformers serve`
(continuous batching) and the llama-cpp-python server, all on SmolLM2-135M-Instruct.

Each server is started in turn on loopback, waited for, loaded by bench/serving/serve.py's closed
loop at each concurrency level (streaming chat, or the --endpoint given; greedy, fixed output
length), and stopped; then the table, the ratios against issue 19's targets, a plot and the
machine go to bench/results/serving.md.
A peer whose virtualenv is missing is skipped with a note (bench/serving/setup_peers.sh makes
them); no number in the results is ever filled in without being measured in this run.

Same work for every server: the same prompts (serve.py draws them per level from a fixed seed)
and `--output-len` output tokens each. Stopping at EOS is switched off where the server lets a
request do so: trio-llm takes `ignore_eos`; transformers serve takes a per-request
`generation_config` (one without `eos_token_id` never stops at EOS); llama-cpp-python takes
`logit_bias` pushing the end-of-turn token down. The "out tok/req" column shows what each served.

The offline reference for the frontend's cost runs the same prompts (tokenized as the endpoint
does: with the chat template for chat) through EngineCore in this process with
bench/engine_step/throughput.py's `run_core`, at max_num_seqs = the concurrency, which is the
closed loop without HTTP.

`--profile` also runs trio-llm once more at one concurrency under py-spy (frontend and engine
processes recorded separately, raw collapsed stacks) and writes the top frames to
bench/results/serving_profile.md.

Layout (bench/serving/): this file is the command line and the run; `peers/` has one module per
server (a new peer is a module there and a line in `peers.SERVERS`), `servers` starts, probes and
stops a server, `load` drives serve.py's load generator and the offline reference, `report`
writes the tables and targets, `profiling` the py-spy run; the endpoints are serve.py's
(`endpoints/`, one module each).

Usage: python bench/serving/compare.py [--servers trio-llm,vllm,transformers,llama-cpp]
       [--concurrency 1 8 32 64] [--profile] [--peers-dir DIR]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

from serving.endpoints import ENDPOINTS  # noqa: E402
from serving.load import Level, offline_reference, run_levels  # noqa: E402
from serving.peers import SERVERS, Server, Skipped  # noqa: E402
from serving.peers.base import SERVER_THREADS  # noqa: E402
from serving.peers.trio_llm_server import DEFAULT_ARGS as DEFAULT_TRIO_LLM_ARGS  # noqa: E402
from serving.peers.trio_llm_server import LABEL as TRIO_LLM  # noqa: E402
from serving.profiling import profile_trio_llm  # noqa: E402
from serving.report import can_plot, load_average, write_plot, write_report  # noqa: E402
from serving.servers import ServerStartError, running  # noqa: E402

REPO = BENCH.parent


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", default="trio-llm,vllm,transformers,llama-cpp")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--endpoint", choices=list(ENDPOINTS), default="chat", help="streamed")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--input-len", type=int, default=64, help="random words per prompt")
    p.add_argument("--prompts-per-client", type=int, default=2)
    p.add_argument("--min-prompts", type=int, default=8)
    p.add_argument(
        "--trio-llm-args",
        action="append",
        default=None,
        help="`trio-llm serve` flags, e.g. --trio-llm-args='--num-threads 1'; repeat to add "
        "variants, the first is the one the targets are read from (default: "
        f"{DEFAULT_TRIO_LLM_ARGS!r})",
    )
    p.add_argument(
        "--peers-dir",
        type=Path,
        default=Path(os.environ.get("TRIO_LLM_PEERS_DIR", REPO.parent / "peers")),
        help="where bench/serving/setup_peers.sh made the peers' virtualenvs (tf/, llama/)",
    )
    p.add_argument(
        "--server-threads",
        type=int,
        default=SERVER_THREADS,
        help="threads of every server (trio-llm's --num-threads, llama.cpp's --n_threads, "
        "transformers' OMP_NUM_THREADS); 1 on a VM whose other tenants keep its cores busy, "
        "where two threads wait on each other at every barrier (default %(default)s)",
    )
    p.add_argument("--offline-concurrency", type=int, default=32, help="0: no offline run")
    p.add_argument("--profile", action="store_true", help="also profile trio-llm with py-spy")
    p.add_argument("--profile-only", action="store_true")
    p.add_argument("--profile-concurrency", type=int, default=32)
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, default=BENCH / "results" / "serving.md")
    p.add_argument("--json", type=Path, default=None, help="also write every level as JSON")
    args = p.parse_args(argv)
    args.trio_llm_args = args.trio_llm_args or [DEFAULT_TRIO_LLM_ARGS]
    return args


REQUIRED = {"httpx": "httpx", "trio": "trio"}
"""What a run cannot do without (module: package), checked before any server starts."""


def check_dependencies() -> str | None:
    """Why the run cannot start, or None. matplotlib is optional: without it the report has
    its tables and no plot (said at the start, not after 20 minutes of measuring)."""
    missing = [pkg for mod, pkg in REQUIRED.items() if importlib.util.find_spec(mod) is None]
    if missing:
        return (
            f"missing {', '.join(missing)}: install the bench extra "
            "(pip install -e '.[bench]' in the project's .venv)"
        )
    if not can_plot():
        print(
            "matplotlib is not installed (the bench extra): the report will have its tables "
            "but no plot",
            file=sys.stderr,
            flush=True,
        )
    return None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    problem = check_dependencies()
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    # Started in the background by a shell, this process would ignore SIGINT, and so would the
    # servers it starts (an ignored signal stays ignored across exec). Both signals interrupt
    # the run instead, so the servers are always stopped on the way out.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix="trio-llm-compare-"))
    print(f"server logs: {logs}", flush=True)
    if args.profile_only:
        text = profile_trio_llm(args, logs)
        args.out.with_name("serving_profile.md").write_text(text)
        print(text)
        return 0
    start = time.perf_counter()
    servers: list[Server] = []
    skipped: list[Skipped] = []
    for name in args.servers.split(","):
        for made in SERVERS[name](args):
            (servers if isinstance(made, Server) else skipped).append(made)
    levels: dict[str, list[Level]] = {}
    loads: dict[str, tuple[str, str]] = {}
    for server in servers:
        print(f"== {server.label}: {shlex.join(server.argv)}", flush=True)
        before = load_average()
        try:
            log = logs / f"{len(levels)}-{server.label.split()[0]}.log"
            with running(server, log, args.start_timeout) as (proc, url):
                levels[server.label] = run_levels(server, proc, url, args)
        except ServerStartError as error:
            skipped.append(Skipped(server.label, f"failed to start: {str(error)[-300:]}"))
            continue
        loads[server.label] = (before, load_average())
    servers = [s for s in servers if s.label in levels]
    offline = None
    if args.offline_concurrency and TRIO_LLM in levels:
        tok_s, prompt_tokens = offline_reference(args, args.offline_concurrency)
        offline = (args.offline_concurrency, tok_s, prompt_tokens)
    text = write_report(args, servers, skipped, levels, offline, loads, time.perf_counter() - start)
    args.out.write_text(text)
    print(text)
    write_plot(args, levels)
    if args.json:
        args.json.write_text(
            json.dumps(
                {k: [dataclasses.asdict(lv) for lv in v] for k, v in levels.items()}, indent=1
            )
        )
    if args.profile:
        profile = profile_trio_llm(args, logs)
        args.out.with_name("serving_profile.md").write_text(profile)
        print(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
