"""Running one server for compare.py: a free port, readiness, CPU time, and a clean stop.

Invariant: a server started by `running` is stopped on the way out, with everything it started
(its own process group: SIGINT, then SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

from serving.peers import Server


class ServerStartError(RuntimeError):
    """A server exited, or never answered its readiness probe, before the load began."""


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
