"""Serving benchmark against peers, side by side in one run: trio-llm, `transformers serve`
(continuous batching) and the llama-cpp-python server, all on SmolLM2-135M-Instruct.

Each server is started in turn on loopback, waited for, loaded by bench/serve.py's closed loop at
each concurrency level (streaming chat, greedy, fixed output length), and stopped; then the table,
the ratios against issue 6's targets, a plot and the machine go to bench/results/serving.md.
A peer whose virtualenv is missing is skipped with a note (bench/setup_peers.sh makes them); no
number in the results is ever filled in without being measured in this run.

Same work for every server: the same prompts (bench/serve.py draws them per level from a fixed
seed) and `--output-len` output tokens each. Stopping at EOS is switched off where the server
lets a request do so: trio-llm takes `ignore_eos`; transformers serve takes a per-request
`generation_config` (one without `eos_token_id` never stops at EOS); llama-cpp-python takes
`logit_bias` pushing the end-of-turn token down. The "out tok/req" column shows what each served.

The offline reference for the frontend's cost runs the same prompts (tokenized with the chat
template) through EngineCore in this process with bench/engine.py's `run_core`, at
max_num_seqs = the concurrency, which is the closed loop without HTTP.

`--profile` also runs trio-llm once more at one concurrency under py-spy (frontend and engine
processes recorded separately, raw collapsed stacks) and writes the top frames to
bench/results/serving_profile.md.

Usage: python bench/compare.py [--servers trio-llm,transformers,llama-cpp] [--concurrency 1 8 32 64]
       [--profile] [--peers-dir DIR]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import importlib.metadata
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import trio

import hostinfo  # bench/hostinfo.py

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import serve  # noqa: E402  (bench/serve.py, the load generator)
from trio_llm.config import EngineArgs  # noqa: E402

REPO = BENCH.parent
MODEL_NAME = "SmolLM2-135M-Instruct"
TRANSFORMERS = "transformers serve"
LLAMA_CPP = "llama-cpp-python server"
SERVER_THREADS = 2
DEFAULT_TRIO_LLM_ARGS = "--max-num-seqs 64"


class ServerStartError(RuntimeError):
    """A server exited, or never answered its readiness probe, before the load began."""


@dataclasses.dataclass(frozen=True)
class Server:
    label: str
    argv: list[str]
    """Command line; "{port}" is replaced by the port picked for the run."""
    model: str
    """What clients send as `model`."""
    ready_path: str
    load_args: list[str]
    """bench/serve.py flags that make this server do the common work (stop-at-EOS off)."""
    description: str
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Skipped:
    label: str
    reason: str


# --------------------------------------------------------------------------------------------
# The servers


def hf_dir() -> Path:
    from trio_llm.engine.loader import resolve_model

    return resolve_model(None).path


def transformers_dir() -> Path:
    """The HF directory with `architectures` in its config, which transformers serve needs.

    The loader's GGUF conversion leaves that key out (trio-llm does not need it), so this links
    the converted files into a directory of its own beside it with a completed config.json.
    """
    source = hf_dir()
    target = source.parent / f"{source.name}-transformers-serve"
    target.mkdir(exist_ok=True)
    for item in source.iterdir():
        link = target / item.name
        if item.name != "config.json" and not link.exists():
            link.symlink_to(item)
    config = json.loads((source / "config.json").read_text())
    config.setdefault("architectures", ["LlamaForCausalLM"])
    (target / "config.json").write_text(json.dumps(config, indent=1))
    return target


def gguf_path() -> Path:
    from trio_llm.engine.loader import default_gguf_path

    return default_gguf_path()


def eos_ids() -> list[int]:
    """Token ids that end SmolLM2-Instruct's turn: `<|im_end|>` (its EOS) and `<|endoftext|>`."""
    added = json.loads((hf_dir() / "tokenizer.json").read_text())["added_tokens"]
    return sorted(t["id"] for t in added if t["content"] in ("<|im_end|>", "<|endoftext|>"))


def trio_llm_servers(args: argparse.Namespace) -> list[Server | Skipped]:
    """One server per --trio-llm-args; the first is "trio-llm", whose numbers meet the targets."""
    script = Path(sys.executable).with_name("trio-llm")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "trio_llm"]
    servers: list[Server | Skipped] = []
    for i, flags in enumerate(args.trio_llm_args):
        extra = shlex.split(flags)
        servers.append(
            Server(
                label="trio-llm" if i == 0 else f"trio-llm {flags}",
                argv=[*launcher, "serve", "--port", "{port}", "--log-level", "warning", *extra],
                model=MODEL_NAME,
                ready_path="/health",
                load_args=["--ignore-eos"],
                description=f"`trio-llm serve {flags}` (default model, dtype auto)",
            )
        )
    return servers


def primary_engine_args(args: argparse.Namespace) -> EngineArgs:
    """The EngineArgs the first trio-llm variant serves with, as its own CLI parses them."""
    from trio_llm.http.config import parse_serve_args

    return parse_serve_args(shlex.split(args.trio_llm_args[0])).engine


def transformers_server(args: argparse.Namespace) -> list[Server | Skipped]:
    venv = args.peers_dir / "tf"
    exe = venv / "bin" / "transformers"
    if not exe.exists():
        return [Skipped(TRANSFORMERS, f"not installed ({exe} missing)")]
    path = str(transformers_dir())
    # A generation_config without eos_token_id: the request runs to max_tokens, like ignore_eos.
    no_eos = json.dumps({"generation_config": json.dumps({"do_sample": False})})
    server = Server(
        label=TRANSFORMERS,
        argv=[
            str(exe),
            "serve",
            "--continuous-batching",
            "--dtype",
            "float32",
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--log-level",
            "warning",
            path,
        ],
        model=path,
        ready_path="/health",
        load_args=["--no-ignore-eos", "--extra-body", no_eos],
        description=f"transformers {peer_version(venv, 'transformers')} "
        "`transformers serve --continuous-batching --dtype float32` on the HF directory "
        "converted from the GGUF",
        env={
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "OMP_NUM_THREADS": str(SERVER_THREADS),
        },
    )
    return [server]


def llama_cpp_server(args: argparse.Namespace) -> list[Server | Skipped]:
    venv = args.peers_dir / "llama"
    python = venv / "bin" / "python"
    if peer_version(venv, "llama_cpp_python") == "?":
        return [Skipped(LLAMA_CPP, f"not installed in {venv}")]
    bias = json.dumps({"logit_bias": {str(i): -100.0 for i in eos_ids()}})
    server = Server(
        label=LLAMA_CPP,
        argv=[
            str(python),
            "-m",
            "llama_cpp.server",
            "--model",
            str(gguf_path()),
            "--model_alias",
            MODEL_NAME,
            "--host",
            "127.0.0.1",
            "--port",
            "{port}",
            "--n_threads",
            str(SERVER_THREADS),
            "--interrupt_requests",
            "False",
        ],
        model=MODEL_NAME,
        ready_path="/v1/models",
        load_args=["--no-ignore-eos", "--extra-body", bias],
        description=f"llama-cpp-python {peer_version(venv, 'llama_cpp_python')} server on the "
        "Q4_1 GGUF, `--n_threads 2 --interrupt_requests False`",
    )
    return [server]


SERVERS = {
    "trio-llm": trio_llm_servers,
    "transformers": transformers_server,
    "llama-cpp": llama_cpp_server,
}


def peer_version(venv: Path, dist: str) -> str:
    """A distribution's version inside another virtualenv, read from its metadata on disk."""
    for site in (venv / "lib").glob("python*/site-packages"):
        for meta in site.glob("*.dist-info"):
            name, _, version = meta.name.removesuffix(".dist-info").partition("-")
            if name.lower().replace("-", "_") == dist.lower().replace("-", "_"):
                return version
    return "?"


# --------------------------------------------------------------------------------------------
# Process handling


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """pid and every process below it, from /proc (children files list direct children)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            with contextlib.suppress(OSError):
                todo += [int(c) for c in (task / "children").read_text().split()]
    return found


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU seconds of these processes (all threads), 0 for one that is gone."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
    return total


@contextlib.contextmanager
def running(server: Server, log: Path, timeout: float) -> Iterator[tuple[subprocess.Popen, str]]:
    port = free_port()
    argv = [a.replace("{port}", str(port)) for a in server.argv]
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **server.env},
            start_new_session=True,
        )
    try:
        wait_ready(proc, url + server.ready_path, timeout, log)
        yield proc, url
    finally:
        stop(proc)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return
        time.sleep(1)
    raise ServerStartError(f"not ready after {timeout:.0f} s:\n{tail(log)}")


def stop(proc: subprocess.Popen) -> None:
    """SIGINT to the server's process group, then SIGTERM, then SIGKILL."""
    for sig, grace in ((signal.SIGINT, 30), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; make sure nothing it started outlives it.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        return


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


# --------------------------------------------------------------------------------------------
# Load


@dataclasses.dataclass
class Level:
    summary: serve.RunSummary
    server_cpu_cores: float
    """CPU seconds of the server's processes per second of the level (warm-up included)."""


def prompt_shape(args: argparse.Namespace) -> list[str]:
    """bench/serve.py flags that decide the prompts: the servers and the offline reference
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

    import engine as engine_bench  # bench/engine.py
    from trio_llm.engine.core import EngineCore

    tokenizer = AutoTokenizer.from_pretrained(hf_dir())
    load = serve.parse_args(prompt_shape(args))
    warmup, texts = serve.level_prompts(load, concurrency)

    def ids(text: str) -> list[int]:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )["input_ids"]

    engine_args = msgspec.structs.replace(primary_engine_args(args), max_num_seqs=concurrency)
    core = EngineCore(engine_args)
    engine_bench.run_core(core, [ids(warmup)], args.output_len, "warm")
    prompts = [ids(t) for t in texts]
    run = engine_bench.run_core(core, prompts, args.output_len, "offline")
    return run.tokens_per_s, sum(map(len, prompts)) / len(prompts)


# --------------------------------------------------------------------------------------------
# Profile


def profile_trio_llm(args: argparse.Namespace, logs: Path) -> str:
    """py-spy on the frontend and the engine while trio-llm serves one level; markdown back."""
    server = trio_llm_servers(args)[0]
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
        f"Machine: {machine()}. Load average at the end: {load_average()}.",
        f"Concurrency {concurrency}, {args.output_len} output tokens, streaming chat; py-spy "
        "at 200 Hz, non-blocking, on the frontend (HTTP, tokenizer, detokenizer) and the engine "
        "process separately. The run under the profiler:",
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


# --------------------------------------------------------------------------------------------
# Report


def machine() -> str:
    import torch

    return (
        f"{hostinfo.describe()}; torch {torch.__version__}, "
        f"transformers {importlib.metadata.version('transformers')}, trio-llm "
        f"{importlib.metadata.version('trio-llm')}"
    )


def load_average() -> str:
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def find(levels: dict[str, list[Level]], label: str, concurrency: int) -> serve.RunSummary | None:
    return next(
        (lv.summary for lv in levels.get(label, []) if lv.summary.concurrency == concurrency), None
    )


PEER_TARGETS = [
    # what is compared, at which concurrency, RunSummary field, against whom, goal on the ratio
    ("c=32 output tok/s", 32, "output_tokens_per_s", TRANSFORMERS, ">=", 3.0),
    ("c=32 output tok/s", 32, "output_tokens_per_s", LLAMA_CPP, ">=", 5.0),
    ("c=32 TTFT p99 (ms)", 32, "ttft_p99", TRANSFORMERS, "<=", 1 / 3),
    ("c=1 ITL p50 (ms)", 1, "itl_p50", LLAMA_CPP, "<=", 2.0),
]
"""Issue 6's targets against the peers."""


def targets_table(
    levels: dict[str, list[Level]], offline: tuple[int, float, float] | None
) -> list[str]:
    """Issue 6's targets for every trio-llm variant; the offline one for the first only."""
    rows = []

    def ratio_row(
        what: str, mine: float | None, theirs: float | None, op: str, bound: float
    ) -> None:
        goal = f"{op} {bound:.2g}"
        if mine is None or theirs is None or math.isnan(mine) or math.isnan(theirs) or not theirs:
            rows.append(f"| {what} | {goal} | not measured in this run | - |")
            return
        ratio = mine / theirs
        met = ratio >= bound if op == ">=" else ratio <= bound
        rows.append(
            f"| {what} | {goal} | {mine:.1f} / {theirs:.1f} = **{ratio:.2f}** | "
            f"{'met' if met else 'missed'} |"
        )

    def get(label: str, c: int, attr: str) -> float | None:
        summary = find(levels, label, c)
        return None if summary is None else getattr(summary, attr)

    for me in [label for label in levels if label.startswith("trio-llm")] or ["trio-llm"]:
        for what, c, attr, peer, op, bound in PEER_TARGETS:
            ratio_row(f"{what}, {me} / {peer}", get(me, c, attr), get(peer, c, attr), op, bound)
    if offline is not None:
        c, tok_s, _ = offline
        ratio_row(
            f"c={c} output tok/s, trio-llm server / EngineCore offline",
            get("trio-llm", c, "output_tokens_per_s"),
            tok_s,
            ">=",
            0.9,
        )
    return [
        "| target | goal | measured | verdict |",
        "|---|---|---|---|",
        *rows,
    ]


def headline(levels: dict[str, list[Level]], concurrency: list[int]) -> list[str]:
    head = "| server | " + " | ".join(f"c={c} tok/s" for c in concurrency)
    head += " | c=1 ITL p50 | c=32 TTFT p50 | c=32 TTFT p99 |"
    out = [head, "|---" * (len(concurrency) + 4) + "|"]
    for label in levels:
        cells = []
        for c in concurrency:
            s = find(levels, label, c)
            cells.append(f"{s.output_tokens_per_s:.1f}" if s else "-")
        one, c32 = find(levels, label, 1), find(levels, label, 32)
        out.append(
            f"| {label} | "
            + " | ".join(cells)
            + f" | {f'{one.itl_p50:.1f} ms' if one else '-'}"
            + f" | {f'{c32.ttft_p50:.0f} ms' if c32 else '-'}"
            + f" | {f'{c32.ttft_p99:.0f} ms' if c32 else '-'} |"
        )
    return out


def write_report(
    args: argparse.Namespace,
    servers: list[Server],
    skipped: list[Skipped],
    levels: dict[str, list[Level]],
    offline: tuple[int, float, float] | None,
    loads: dict[str, tuple[str, str]],
    seconds: float,
) -> str:
    rows = [lv.summary for mine in levels.values() for lv in mine]
    plot = args.out.with_suffix(".png")
    if rows:
        serve.plot(rows, plot)
    lines = [
        "# Serving benchmark: trio-llm against its peers, side by side",
        "",
        f"Machine: {machine()}.",
        f"Date: {datetime.datetime.now().isoformat(timespec='minutes')}. Whole run: "
        f"{seconds / 60:.1f} min.",
        "",
        f"Model: {MODEL_NAME} on every server. Load: bench/serve.py closed loop at concurrency "
        f"{', '.join(map(str, args.concurrency))}; at each level max({args.min_prompts}, "
        f"{args.prompts_per_client} x concurrency) streaming chat requests (a modest count, to "
        "keep a full run short: the percentiles of the small levels rest on few requests), "
        f"each {args.input_len} random words after a fixed instruction, {args.output_len} "
        "output tokens, greedy, stop-at-EOS off (see bench/compare.py for how each server is "
        "told), after one untimed warm-up request per level. Percentiles over requests (TTFT, "
        "E2E) and over token gaps (ITL); `server CPU` is cores used by the server's processes "
        "during the level, `client CPU` those of the load generator, which shares the 2 cores.",
        "",
        "Servers:",
        "",
    ]
    for server in servers:
        before, after = loads.get(server.label, ("?", "?"))
        lines.append(
            f"- **{server.label}**: {server.description}. Load average before / after: "
            f"{before} / {after}."
        )
    for skip in skipped:
        lines.append(f"- **{skip.label}**: skipped, {skip.reason}.")
    lines += ["", "## Headline", "", *headline(levels, args.concurrency), ""]
    lines += ["## Targets (issue 6)", "", *targets_table(levels, offline), ""]
    if offline is not None:
        c, tok_s, prompt_tokens = offline
        lines += [
            f"Offline reference: EngineCore in-process (bench/engine.py `run_core`), the c={c} "
            f"prompts ({prompt_tokens:.0f} prompt tokens on average after the chat template), "
            f"the first trio-llm's engine settings with max_num_seqs={c}: {tok_s:.1f} output "
            "tok/s.",
            "",
        ]
    lines += ["## All levels", "", serve.markdown_table(rows).rstrip()]
    lines += ["", "| server | conc. | server CPU (cores) |", "|---|---|---|"]
    for label, mine in levels.items():
        for lv in mine:
            lines.append(f"| {label} | {lv.summary.concurrency} | {lv.server_cpu_cores:.2f} |")
    errors = [r for r in rows if r.errors]
    if errors:
        lines += ["", "Errors:", ""]
        lines += [f"- {r.label} c={r.concurrency}: {r.errors} x {r.first_error}" for r in errors]
    if rows:
        lines += ["", f"![output tokens/s and TTFT p99 against concurrency]({plot.name})"]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--servers", default="trio-llm,transformers,llama-cpp")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
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
        help="where bench/setup_peers.sh made the peers' virtualenvs (tf/, llama/)",
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
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
    if args.offline_concurrency and "trio-llm" in levels:
        tok_s, prompt_tokens = offline_reference(args, args.offline_concurrency)
        offline = (args.offline_concurrency, tok_s, prompt_tokens)
    text = write_report(args, servers, skipped, levels, offline, loads, time.perf_counter() - start)
    args.out.write_text(text)
    print(text)
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
