"""compare.py's load: serve.py's closed loop at each concurrency level against one server,
and the offline reference (EngineCore in this process on the same prompts, no HTTP).

Invariant: every server and the offline reference draw the same prompts (`prompt_shape`).
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import time

import msgspec
import trio

from serving import serve  # the load generator
from serving.endpoints import ENDPOINTS
from serving.peers import Server
from serving.peers.base import hf_dir
from serving.peers.trio_llm_server import primary_engine_args
from serving.servers import cpu_seconds, descendants


@dataclasses.dataclass
class Level:
    summary: serve.RunSummary
    server_cpu_cores: float
    """CPU seconds of the server's processes per second of the level (warm-up included)."""


def prompt_shape(args: argparse.Namespace) -> list[str]:
    """serve.py flags that decide the prompts: the servers and the offline reference
    must draw the same ones."""
    return [
        "--input-len",
        str(args.input_len),
        "--prompts-per-client",
        str(args.prompts_per_client),
        "--min-prompts",
        str(args.min_prompts),
    ]


def load_args(server: Server, url: str, args: argparse.Namespace) -> argparse.Namespace:
    return serve.parse_args(
        [
            "--base-url",
            url,
            "--model",
            server.model,
            "--label",
            server.label,
            "--endpoint",
            args.endpoint,
            "--output-len",
            str(args.output_len),
            *prompt_shape(args),
            "--timeout",
            "1800",
            *server.load_args,
        ]
    )


def run_levels(
    server: Server, proc: subprocess.Popen, url: str, args: argparse.Namespace
) -> list[Level]:
    load = load_args(server, url, args)
    levels = []
    for concurrency in args.concurrency:
        pids = descendants(proc.pid)
        cpu0, t0 = cpu_seconds(pids), time.perf_counter()
        results, duration, client_cpu = trio.run(serve.run_load, load, concurrency, None)
        server_cpu = (cpu_seconds(pids) - cpu0) / (time.perf_counter() - t0)
        summary = serve.summarize(server.label, results, duration, concurrency, None, client_cpu)
        levels.append(Level(summary, server_cpu))
        print(serve.markdown_table([summary]), flush=True)
        if summary.errors == summary.num_requests:
            print(f"{server.label}: every request failed; skipping its higher levels", flush=True)
            break
    return levels


def offline_reference(args: argparse.Namespace, concurrency: int) -> tuple[float, float]:
    """(output tok/s, mean prompt tokens) of EngineCore on the level's prompts, no HTTP."""
    from transformers import AutoTokenizer

    from engine_step import throughput
    from trio_llm.engine.step.core import EngineCore

    tokenizer = AutoTokenizer.from_pretrained(hf_dir())
    load = serve.parse_args(prompt_shape(args))
    warmup, texts = serve.level_prompts(load, concurrency)

    def ids(text: str) -> list[int]:
        return ENDPOINTS[args.endpoint].prompt_token_ids(tokenizer, text)

    engine_args = msgspec.structs.replace(primary_engine_args(args), max_num_seqs=concurrency)
    core = EngineCore(engine_args)
    throughput.run_core(core, [ids(warmup)], args.output_len, "warm")
    prompts = [ids(t) for t in texts]
    run = throughput.run_core(core, prompts, args.output_len, "offline")
    return run.tokens_per_s, sum(map(len, prompts)) / len(prompts)
