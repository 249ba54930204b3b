"""`python -m trio_llm serve` in a subprocess on a loopback port, for integration tests (and
bench/serving/soak.py), plus what they read about its processes from /proc."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

_SERVING = re.compile(r"serving .* on (https?://[^\s,]+)")


@dataclass
class ServerProcess:
    process: subprocess.Popen[str]
    url: str = ""
    log: list[str] = field(default_factory=list)
    expected_exit: int = 0
    """What `run_server` checks the process exited with; a test that kills it says so here."""

    def metrics(self) -> dict[str, float]:
        """The unlabelled samples of /metrics, by name."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#") and "{" not in line:
                name, value = line.rsplit(" ", 1)
                samples[name] = float(value)
        return samples

    def wait_idle(self, timeout: float = 1.0) -> dict[str, float]:
        """Wait until the engine runs nothing and every KV block is free; the last sample."""
        deadline = time.monotonic() + timeout
        while True:
            m = self.metrics()
            idle = (
                m["trio_llm_num_requests_running"] == 0
                and m["trio_llm_num_requests_waiting"] == 0
                and m["trio_llm_kv_cache_free_blocks"] == m["trio_llm_kv_cache_total_blocks"]
            )
            if idle or time.monotonic() > deadline:
                return m
            time.sleep(0.02)

    def engine_pid(self) -> int:
        """The engine process: the server's only child."""
        [child] = self.engine_pids()
        return child

    def engine_pids(self) -> list[int]:
        """The engine processes: the server's children."""
        tasks = Path(f"/proc/{self.process.pid}/task").iterdir()
        return sorted(int(c) for task in tasks for c in (task / "children").read_text().split())

    def labelled(self, name: str) -> dict[tuple[str, ...], float]:
        """The samples of one labelled metric of /metrics, by their label values in order."""
        text = httpx.get(self.url + "/metrics", timeout=10).text
        samples = {}
        for line in text.splitlines():
            if line.startswith(name + "{"):
                labels, value = line[len(name) + 1 :].rsplit("} ", 1)
                key = tuple(part.split("=", 1)[1].strip('"') for part in labels.split(","))
                samples[key] = float(value)
        return samples

    def wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while httpx.get(self.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the server did not become healthy"
            time.sleep(0.1)

    def wait_running(self, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.metrics()["trio_llm_num_requests_running"] < count:
            assert time.monotonic() < deadline, "the engine never started the request"
            time.sleep(0.02)


@contextmanager
def run_server(*args: str, startup_timeout: float = 180.0) -> Iterator[ServerProcess]:
    """Start the server (port chosen by the OS), yield once it serves, SIGTERM it at the end
    and check it shut down cleanly."""
    env = {**os.environ, "TRIO_LLM_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "trio_llm", "serve", *args, "--port", "0", "--log-level", "info"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    server = ServerProcess(process)
    found = threading.Event()

    def drain() -> None:  # keep reading, or a full pipe would block the server
        assert process.stderr is not None
        for line in process.stderr:
            server.log.append(line)
            if not found.is_set() and (match := _SERVING.search(line)):
                server.url = match.group(1)
                found.set()
        found.set()

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        if not found.wait(startup_timeout) or not server.url:
            raise RuntimeError("the server did not start:\n" + "".join(server.log[-40:]))
        yield server
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
        reader.join(timeout=5)
    assert code == server.expected_exit, "".join(server.log[-40:])
    # Nothing after "shut down": an engine on the CPU never imports Triton, whose nanobind
    # modules printed hundreds of "leaked function" lines at exit (engine/process.py).
    assert not any("nanobind: leaked" in line for line in server.log), "".join(server.log[-20:])


def run_small_server(model_dir: Path, *args: str) -> AbstractContextManager[ServerProcess]:
    """`run_server` on a model directory with a small engine (4 sequences, a 32 MiB KV cache,
    float32) that stops quickly: for tests that drive the server as a user would."""
    return run_server(
        str(model_dir),
        "--max-num-seqs", "4",
        "--kv-cache-memory", "32MiB",
        "--dtype", "float32",
        "--shutdown-timeout", "2",
        *args,
    )  # fmt: skip


def rss_kib(pid: int) -> int:
    """Resident memory of a process (VmRSS), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise ValueError(f"no VmRSS for pid {pid}")


def fd_targets(pid: int) -> list[str]:
    """What each open fd of a process points at (`/memfd:...`, `socket:[...]`, paths)."""
    targets = []
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            targets.append(os.readlink(fd))
        except FileNotFoundError:  # closed while we looked
            pass
    return targets


def dev_shm() -> set[str]:
    return set(os.listdir("/dev/shm"))


def dev_shm_used(pid: int) -> set[str]:
    """The /dev/shm entries a process holds open or has mapped, leaving out the unlinked ones
    (named "... (deleted)"; e.g. multiprocessing's semaphores, which tqdm makes): those are
    gone from /dev/shm already."""
    maps = [
        line.split(maxsplit=5)[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines()
    ]
    return {
        t for t in [*fd_targets(pid), *maps]
        if t.startswith("/dev/shm/") and not t.endswith(" (deleted)")
    }  # fmt: skip
