"""Frontend<->engine transports side by side: the shared-memory ring, ZMQ PUSH/PULL, mp.Pipe.

    python bench/serving/ipc.py [--quick] [--out bench/results/ipc.md]

Each transport carries the same payloads, msgspec-encoded `EngineCoreOutputs` of about 64 B,
1 KiB, 64 KiB and 1 MiB, from this process to a child process (a fresh interpreter started with
the fds it needs). Encoding happens once, outside the timed loop, and the receiver does not
decode: the codec costs the same over every transport, so it has its own column. Each side uses
its transport the idiomatic fast way:

- ring: blocking `send`; `receive()` returns `bytes` (one copy out of the ring, the only way
  out: a view into the ring would read memory the producer reuses);
- ZMQ: `send(copy=False)` (pyzmq copies below its 64 KiB threshold), `recv()` below 64 KiB and
  `recv(copy=False)` with the frame's buffer from 64 KiB up, as vLLM does;
- Pipe: `Connection.send_bytes`/`recv_bytes`.

The targets compare the ring with ZMQ: at the same receive semantics (`bytes`) below 64 KiB;
from 64 KiB up ZMQ hands over its frame without a copy while the ring still copies. Runs of all
transports are interleaved and repeated; the tables show medians.

Measured: one-way throughput (messages/s, MB/s); ping-pong round trip of a 64 B message
(p50/p99 over many round trips); CPU time a pair burns while both ends wait for a message.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import multiprocessing.connection
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from trio_llm.ipc import RingSpec, ShmRing, encode
from trio_llm.ipc.messages import EngineCoreOutput, EngineCoreOutputs, SchedulerStats

BENCH = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(BENCH))  # bench/: bench modules are imported by their path under it

import hostinfo  # noqa: E402

SIZES = [64, 1024, 64 * 1024, 1024 * 1024]
RING_CAPACITY = 8 * 1024 * 1024
TARGETS = {64: 2.0, 1024: 2.0, 1024 * 1024: 3.0}
"""Minimum ring/ZMQ messages-per-second ratios the issue asks for."""
ZMQ_COPY_THRESHOLD = 64 * 1024


def payload_of_size(size: int) -> bytes:
    """A real engine message (one step's outputs) whose encoding is close to `size` bytes."""

    def build(tokens: int) -> bytes:
        out = EngineCoreOutput(
            request_id="cmpl-0123456789abcdef",
            new_token_ids=[1000 + i % 30000 for i in range(tokens)],
        )
        return encode(EngineCoreOutputs(outputs=[out], timestamp=0.0, stats=SchedulerStats()))

    low, high = 0, size
    while low < high:  # the largest token count whose encoding fits in `size`
        mid = (low + high + 1) // 2
        if len(build(mid)) <= size:
            low = mid
        else:
            high = mid - 1
    return build(low)


# -- the child: receives (or echoes) on one transport, told what to do over stdin ---------------


class ChildEnd:
    """The child's end of one transport: `receive`, `send`, and an idle wait."""

    def __init__(self, kind: str, arg: str) -> None:
        self.copy = True
        if kind == "ring":
            down, up = msgspec.json.decode(arg, type=tuple[RingSpec, RingSpec])
            inbound, outbound = ShmRing.attach(down), ShmRing.attach(up)
            inbound.watch_peer(os.getppid())
            outbound.watch_peer(os.getppid())
            rx = inbound.receiver()
            self.send = outbound.sender().send
            self.receive = rx.receive
            self.idle = lambda seconds: _timeout_ok(rx.receive, seconds)
        elif kind == "zmq":
            import zmq

            ctx = zmq.Context()
            pull = ctx.socket(zmq.PULL)
            pull.connect(arg + "-down")
            push = ctx.socket(zmq.PUSH)
            push.connect(arg + "-up")
            self.receive = lambda: pull.recv() if self.copy else pull.recv(copy=False).buffer
            self.send = lambda data: push.send(data, copy=False)
            self.idle = lambda seconds: pull.poll(int(seconds * 1000))
        elif kind == "pipe":
            down_fd, up_fd = (int(x) for x in arg.split(","))
            down = multiprocessing.connection.Connection(down_fd, writable=False)
            up = multiprocessing.connection.Connection(up_fd, readable=False)
            self.receive, self.send, self.idle = down.recv_bytes, up.send_bytes, down.poll
        else:
            raise ValueError(kind)


def child_main(kind: str, arg: str) -> None:
    """Commands on stdin: 'recv N' (take N messages, then print 'done'), 'echo N', 'idle S',
    'copy 0|1' (ZMQ: receive frames without copying them, from 64 KiB up)."""
    end = ChildEnd(kind, arg)
    for line in sys.stdin:
        command, value = line.split()
        if command == "copy":
            end.copy = value == "1"
            continue
        if command == "idle":
            before = resource.getrusage(resource.RUSAGE_SELF)
            end.idle(float(value))
            after = resource.getrusage(resource.RUSAGE_SELF)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            print(f"cpu {cpu}", flush=True)
            continue
        receive, send = end.receive, end.send
        before = cpu_seconds()
        if command == "recv":
            for _ in range(int(value)):
                receive()
        elif command == "echo":
            for _ in range(int(value)):
                send(receive())
        print(f"done {cpu_seconds() - before}", flush=True)


def cpu_seconds() -> float:
    """CPU time of this process so far, all its threads (ZMQ's I/O thread included)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _timeout_ok(fn: Callable[..., object], seconds: float) -> None:
    try:
        fn(timeout=seconds)
    except TimeoutError:
        pass


# -- the parent side of each transport ------------------------------------------------------------


class Transport:
    """This process's end of one transport, plus the child at the other end."""

    name: str

    def __init__(
        self, child_arg: str, pass_fds: tuple[int, ...] = (), child_kind: str | None = None
    ) -> None:
        self.child = subprocess.Popen(
            [sys.executable, __file__, "--child", child_kind or self.name, child_arg],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=pass_fds,
        )

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def receive(self) -> object:
        raise NotImplementedError

    def prepare(self, size: int) -> None:
        """Per-size configuration before the child starts receiving."""

    def command(self, line: str) -> None:
        assert self.child.stdin is not None
        self.child.stdin.write(line + "\n")
        self.child.stdin.flush()

    def reply(self) -> str:
        assert self.child.stdout is not None
        return self.child.stdout.readline().strip()

    def idle_receive(self, seconds: float) -> None:
        raise NotImplementedError

    def close(self) -> None:
        assert self.child.stdin is not None
        self.child.stdin.close()
        self.child.wait(10)


class RingTransport(Transport):
    def __init__(self, name: str, fence: str = "lock") -> None:
        self.name = name
        self.down = ShmRing.create(RING_CAPACITY, fence=fence)  # type: ignore[arg-type]
        self.up = ShmRing.create(RING_CAPACITY, fence=fence)  # type: ignore[arg-type]
        arg = msgspec.json.encode([self.down.spec, self.up.spec]).decode()
        Transport.__init__(self, arg, self.down.fds + self.up.fds, child_kind="ring")
        self.down.watch_peer(self.child.pid)
        self.up.watch_peer(self.child.pid)
        self.tx, self.rx = self.down.sender(), self.up.receiver()
        self.send = self.tx.send  # type: ignore[method-assign]
        self.receive = self.rx.receive  # type: ignore[method-assign]

    def idle_receive(self, seconds: float) -> None:
        _timeout_ok(self.rx.receive, seconds)

    def close(self) -> None:
        super().close()
        self.down.close()
        self.up.close()


class ZmqTransport(Transport):
    name = "zmq"

    def __init__(self, workdir: str) -> None:
        import zmq

        address = f"ipc://{workdir}/zmq"
        self.ctx = zmq.Context()
        self.push = self.ctx.socket(zmq.PUSH)
        self.push.bind(address + "-down")
        self.pull = self.ctx.socket(zmq.PULL)
        self.pull.bind(address + "-up")
        super().__init__(address)
        self.receive = self.pull.recv  # type: ignore[method-assign]

    def send(self, data: bytes) -> None:  # type: ignore[override]
        self.push.send(data, copy=False)

    def prepare(self, size: int) -> None:
        self.command(f"copy {int(size < ZMQ_COPY_THRESHOLD)}")

    def idle_receive(self, seconds: float) -> None:
        self.pull.poll(int(seconds * 1000))

    def close(self) -> None:
        super().close()
        self.ctx.destroy(linger=0)


class PipeTransport(Transport):
    name = "pipe"

    def __init__(self) -> None:
        down_r, self.down = multiprocessing.Pipe(duplex=False)
        self.up, up_w = multiprocessing.Pipe(duplex=False)
        fds = (down_r.fileno(), up_w.fileno())
        super().__init__(f"{fds[0]},{fds[1]}", fds)
        down_r.close()
        up_w.close()
        self.send = self.down.send_bytes  # type: ignore[method-assign]
        self.receive = self.up.recv_bytes  # type: ignore[method-assign]

    def idle_receive(self, seconds: float) -> None:
        self.up.poll(seconds)


# -- measurements ---------------------------------------------------------------------------------


def one_way(t: Transport, payload: bytes, count: int) -> tuple[float, float, float]:
    """Seconds to move `count` messages to the child, until it has taken the last one; the CPU
    seconds both processes spent on it; the CPU seconds the sending thread spent in `send`."""
    t.prepare(len(payload))
    t.command(f"recv {count}")
    send = t.send
    cpu = cpu_seconds()
    start = time.perf_counter()
    in_send = time.thread_time()
    for _ in range(count):
        send(payload)
    in_send = time.thread_time() - in_send
    reply = t.reply().split()
    elapsed = time.perf_counter() - start
    cpu = cpu_seconds() - cpu
    assert reply[0] == "done", reply
    return elapsed, cpu + float(reply[1]), in_send


def ping_pong(t: Transport, payload: bytes, count: int) -> list[float]:
    """Round-trip times (seconds) of `payload`, echoed by the child."""
    t.prepare(len(payload))
    t.command(f"echo {count}")
    send, receive = t.send, t.receive
    clock = time.perf_counter
    times = []
    for _ in range(count):
        start = clock()
        send(payload)
        receive()
        times.append(clock() - start)
    assert t.reply().startswith("done")
    return times


def idle_cpu(t: Transport, seconds: float) -> float:
    """CPU used by both ends (fraction of one core) while each waits for a message."""
    t.command(f"idle {seconds}")
    before = resource.getrusage(resource.RUSAGE_SELF)
    t.idle_receive(seconds)
    after = resource.getrusage(resource.RUSAGE_SELF)
    ours = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    reply = t.reply()
    theirs = float(reply.split()[1])
    return (ours + theirs) / seconds


def codec_cost(payload: bytes, repeat: int) -> tuple[float, float]:
    """Microseconds to encode / decode this message once (what every transport adds)."""
    from trio_llm.ipc import decode_engine_message

    message = decode_engine_message(payload)
    start = time.perf_counter()
    for _ in range(repeat):
        encode(message)
    encoded = (time.perf_counter() - start) / repeat
    start = time.perf_counter()
    for _ in range(repeat):
        decode_engine_message(payload)
    decoded = (time.perf_counter() - start) / repeat
    return encoded * 1e6, decoded * 1e6


# -- report ---------------------------------------------------------------------------------------


def machine() -> list[str]:
    model = hostinfo.cpu_name()

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"

    import zmq

    return [
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- CPU: {model}, {os.cpu_count()} cores visible; kernel {platform.release()}",
        f"- load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        f"- Python {platform.python_version()}, msgspec {version('msgspec')}, "
        f"pyzmq {zmq.__version__} (libzmq {zmq.zmq_version()}), torch {version('torch')}",
    ]


def human(size: int) -> str:
    return (
        f"{size // 1024 // 1024} MiB"
        if size >= 1 << 20
        else (f"{size // 1024} KiB" if size >= 1024 else f"{size} B")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer messages and repeats")
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "ipc.md")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    scale = 0.2 if args.quick else 1.0
    repeats = 2 if args.quick else args.repeats
    counts = {64: 100_000, 1024: 80_000, 64 * 1024: 8_000, 1024 * 1024: 600}

    header = machine()
    print("\n".join(header), flush=True)
    payloads = {size: payload_of_size(size) for size in SIZES}
    with tempfile.TemporaryDirectory() as workdir:
        transports: list[Transport] = [
            RingTransport("ring"),
            RingTransport("ring, membarrier", fence="membarrier"),
            ZmqTransport(workdir),
            PipeTransport(),
        ]
        names = [t.name for t in transports]
        try:
            rates: dict[tuple[str, int], list[float]] = {}
            cpus: dict[tuple[str, int], list[float]] = {}
            sends: dict[tuple[str, int], list[float]] = {}
            for size in SIZES:
                count = max(50, int(counts[size] * scale))
                for t in transports:  # warm up: first touch of buffers and pages
                    one_way(t, payloads[size], max(10, count // 10))
                for _ in range(repeats):
                    for t in transports:
                        seconds, cpu, in_send = one_way(t, payloads[size], count)
                        rates.setdefault((t.name, size), []).append(count / seconds)
                        cpus.setdefault((t.name, size), []).append(cpu / count)
                        sends.setdefault((t.name, size), []).append(in_send / count)
                print(f"one-way {human(size)} done", flush=True)
            rtts, idle = {}, {}
            for t in transports:
                ping_pong(t, payloads[64], 500)
                rtts[t.name] = ping_pong(t, payloads[64], int(20_000 * scale))
                idle[t.name] = idle_cpu(t, 1.0)
        finally:
            for t in transports:
                t.close()
    codec = {size: codec_cost(payloads[size], max(3, 2_000_000 // size)) for size in SIZES}

    lines = [
        "# IPC: shared-memory ring vs ZMQ PUSH/PULL vs multiprocessing.Pipe",
        "",
        f"Command: `{hostinfo.command()}`. Medians of {repeats} interleaved runs; ring "
        f"capacity {RING_CAPACITY >> 20} MiB. What each row does is in the docstring of "
        "bench/serving/ipc.py.",
        "",
        *header,
        "",
        "## One-way throughput",
        "",
        "| payload | transport | msg/s | MB/s | vs ZMQ | CPU µs/msg, both ends "
        "| of which in `send` |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for size in SIZES:
        actual = len(payloads[size])
        med = {name: statistics.median(rates[(name, size)]) for name in names}
        cpu = {name: statistics.median(cpus[(name, size)]) * 1e6 for name in names}
        for name in names:
            in_send = statistics.median(sends[(name, size)]) * 1e6
            lines.append(
                f"| {human(size)} ({actual} B) | {name} | {med[name]:,.0f} "
                f"| {med[name] * actual / 1e6:,.1f} | {med[name] / med['zmq']:.2f}x "
                f"| {cpu[name]:.2f} | {in_send:.2f} |"
            )
        if size in TARGETS:
            ratio = med["ring"] / med["zmq"]
            verdicts.append(
                f"- {human(size)}: ring / ZMQ = {ratio:.2f}x, target ≥ {TARGETS[size]:g}x: "
                f"{'met' if ratio >= TARGETS[size] else 'MISSED'} (CPU per message: ZMQ / "
                f"ring = {cpu['zmq'] / cpu['ring']:.2f}x)"
            )
    lines += [
        "",
        "Targets (ring against ZMQ; from 64 KiB up ZMQ does not copy, the ring does):",
        *verdicts,
    ]
    lines += [
        "",
        "Codec cost per message (µs, in this process), the same over every transport:",
        "",
        "| payload | encode µs | decode µs |",
        "|---|---:|---:|",
        *(f"| {human(size)} | {codec[size][0]:.1f} | {codec[size][1]:.1f} |" for size in SIZES),
        "",
        "## Ping-pong round trip (64 B) and idle cost",
        "",
        "| transport | RTT p50 µs | RTT p99 µs | idle CPU, both ends (% of a core) |",
        "|---|---:|---:|---:|",
    ]
    for name in rtts:
        q = statistics.quantiles(rtts[name], n=100)
        lines.append(f"| {name} | {q[49] * 1e6:.1f} | {q[98] * 1e6:.1f} | {idle[name] * 100:.2f} |")
    p50 = {name: statistics.median(rtts[name]) for name in rtts}
    ratio = p50["ring"] / p50["zmq"]
    lines += [
        "",
        f"Ring p50 / ZMQ p50 = {ratio:.2f}, target ≤ 0.5: {'met' if ratio <= 0.5 else 'MISSED'}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
    else:
        main()
