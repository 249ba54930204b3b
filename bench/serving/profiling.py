"""compare.py --profile: trio-llm under load, its frontend and engine processes under py-spy."""

from __future__ import annotations

import argparse
import collections
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

import hostinfo
from serving import serve  # the load generator
from serving.load import load_args
from serving.peers import Server, trio_llm_server
from serving.report import load_average, machine
from serving.servers import cpu_seconds, descendants, running


def profile_trio_llm(args: argparse.Namespace, logs: Path) -> str:
    """py-spy on the frontend and the engine while trio-llm serves one level; markdown back."""
    server = trio_llm_server.servers(args)[0]
    assert isinstance(server, Server)
    py_spy = Path(sys.executable).with_name("py-spy")
    out_dir = args.out.parent / "profiles"
    out_dir.mkdir(parents=True, exist_ok=True)
    concurrency = args.profile_concurrency
    with running(server, logs / "trio-llm-profile.log", args.start_timeout) as (proc, url):
        pids = descendants(proc.pid)
        engine_pid = next(p for p in pids if p != proc.pid)
        load = load_args(server, url, args)
        # Warm the server first so the recording covers steady serving, not start-up.
        trio.run(serve.run_load, load, concurrency, None)
        recorders = {}
        for name, pid in (("frontend", proc.pid), ("engine", engine_pid)):
            raw = out_dir / f"trio-llm-{name}-c{concurrency}.txt"
            recorders[name] = (
                raw,
                subprocess.Popen(
                    [
                        *(str(py_spy), "record", "--pid", str(pid), "--rate", "200"),
                        *("--format", "raw", "--output", str(raw), "--nonblocking"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                ),
            )
        time.sleep(2)  # py-spy attaches
        cpu = {
            name: cpu_seconds([pid])
            for name, pid in (("frontend", proc.pid), ("engine", engine_pid))
        }
        t0 = time.perf_counter()
        results, duration, client_cpu = trio.run(serve.run_load, load, concurrency, None)
        elapsed = time.perf_counter() - t0
        cores = {
            name: (cpu_seconds([pid]) - cpu[name]) / elapsed
            for name, pid in (("frontend", proc.pid), ("engine", engine_pid))
        }
        for _, recorder in recorders.values():
            recorder.send_signal(signal.SIGINT)
            recorder.wait(60)
    summary = serve.summarize(
        "trio-llm under py-spy", results, duration, concurrency, None, client_cpu
    )
    lines = [
        "# trio-llm under load, profiled with py-spy",
        "",
        f"Command: `{hostinfo.command()}`",
        "",
        f"Machine: {machine()}. Load average at the end: {load_average()}.",
        f"Concurrency {concurrency}, {args.output_len} output tokens, streaming {args.endpoint}; "
        "py-spy at 200 Hz, non-blocking, on the frontend (HTTP, tokenizer, detokenizer) and the "
        "engine process separately. The run under the profiler:",
        "",
        serve.markdown_table([summary]),
        f"CPU used while loaded (cores): frontend {cores['frontend']:.2f}, engine "
        f"{cores['engine']:.2f}, load generator {client_cpu:.2f}.",
        "",
    ]
    for name, (raw, _) in recorders.items():
        lines += top_frames(name, raw, elapsed)
    names = ", ".join(raw.name for raw, _ in recorders.values())
    lines.append(f"Raw collapsed stacks: bench/results/profiles/ ({names}).")
    return "\n".join(lines) + "\n"


def top_frames(name: str, raw: Path, elapsed: float, rows: int = 15) -> list[str]:
    """Self and inclusive sample shares per function from py-spy's collapsed stacks."""
    self_count: collections.Counter[str] = collections.Counter()
    incl_count: collections.Counter[str] = collections.Counter()
    total = 0
    if not raw.exists():
        return [f"## {name}: py-spy wrote nothing", ""]
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack:
            continue
        count = int(count_text)
        frames = [short_frame(f) for f in stack.split(";")[1:]]  # [0] is the thread
        total += count
        if frames:
            self_count[frames[-1]] += count
        for frame in set(frames):
            incl_count[frame] += count
    out = [
        f"## {name}: {total} samples with Python on CPU ({total / 200 / elapsed:.2f} "
        "thread-seconds per second)",
        "",
        "| self % | function | | inclusive % | function |",
        "|---|---|---|---|---|",
    ]
    selfs = self_count.most_common(rows)
    incls = incl_count.most_common(rows)
    for i in range(rows):
        s = selfs[i] if i < len(selfs) else ("", 0)
        c = incls[i] if i < len(incls) else ("", 0)
        out.append(
            f"| {100 * s[1] / max(total, 1):.1f} | `{s[0]}` | | "
            f"{100 * c[1] / max(total, 1):.1f} | `{c[0]}` |"
        )
    return [*out, ""]


def short_frame(frame: str) -> str:
    """'func (path/to/module.py:123)' -> 'func (module.py:123)'."""
    func, _, where = frame.partition(" (")
    return f"{func} ({where.rsplit('/', 1)[-1]}" if where else func
