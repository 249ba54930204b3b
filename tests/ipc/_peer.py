"""The other process of the ring tests: attaches to rings it inherited and plays one role.

Run as `python _peer.py ROLE SPEC_JSON [ARGS...]`, started with `pass_fds=ring.fds`. Every role
watches its parent, so a killed test never leaves it behind. What it reports goes to stdout as
one JSON object per line.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys
import time
import zlib

import msgspec

from trio_llm.ipc import PeerDiedError, RingClosedError, RingSpec, ShmRing


def report(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def attach(arg: str) -> ShmRing:
    ring = ShmRing.attach(msgspec.json.decode(arg, type=RingSpec))
    ring.watch_peer(os.getppid())
    return ring


def echo(in_spec: str, out_spec: str) -> None:
    """Send back every message received, until the input closes; then close the output."""
    with attach(in_spec) as inbound, attach(out_spec) as outbound:
        rx, tx = inbound.receiver(), outbound.sender()
        try:
            while True:
                tx.send(rx.receive())
        except RingClosedError:
            tx.close()


def stress_payload(seq: int, lengths: list[int], filler: bytes) -> bytes:
    return seq.to_bytes(8, "little") + filler[: lengths[seq % len(lengths)]]


def stress_tables(seed: int, max_len: int) -> tuple[list[int], bytes, list[int], list[float]]:
    rng = random.Random(seed)
    lengths = [rng.choice((0, rng.randrange(max_len + 1))) for _ in range(4099)]
    filler = bytes(rng.randrange(256) for _ in range(max_len))
    # Pause after a random number of messages, for a random time: long enough (sometimes) for
    # the other side to find the ring empty or full and go to sleep.
    gaps = [rng.randrange(1, 3000) for _ in range(1000)]
    pauses = [rng.choice((0.0, 20e-6, 200e-6, 2e-3)) for _ in range(1000)]
    return lengths, filler, gaps, pauses


def stress_source(out_spec: str, count: str, seed: str, max_len: str) -> None:
    """Send `count` checksummed messages with random pauses, then close."""
    with attach(out_spec) as ring:
        tx = ring.sender()
        lengths, filler, gaps, pauses = stress_tables(int(seed), int(max_len))
        crc = 0
        next_pause, k = gaps[0], 0
        for seq in range(int(count)):
            payload = stress_payload(seq, lengths, filler)
            crc = zlib.crc32(payload, crc)
            tx.send(payload, timeout=30)
            if seq == next_pause:
                k += 1
                time.sleep(pauses[k % 1000])
                next_pause += gaps[k % 1000]
        tx.close()
        stats = ring.statistics()
        report(crc=crc, waits=stats.waits, doorbells=stats.doorbells_rung)


def stress_sink(in_spec: str, count: str, seed: str, max_len: str) -> None:
    """Receive and check every message (order, length, content), with random pauses."""
    with attach(in_spec) as ring:
        rx = ring.receiver()
        _, _, gaps, pauses = stress_tables(int(seed) + 1, int(max_len))  # pauses of its own
        expected_lengths, expected_filler, _, _ = stress_tables(int(seed), int(max_len))
        crc = 0
        seq = 0
        next_pause, k = gaps[0], 0
        try:
            while True:
                data = rx.receive(timeout=30)
                if data != stress_payload(seq, expected_lengths, expected_filler):
                    got = int.from_bytes(data[:8], "little")
                    report(error=f"message {seq}: got sequence {got}, {len(data)} bytes")
                    sys.exit(1)
                crc = zlib.crc32(data, crc)
                seq += 1
                if seq == next_pause:
                    k += 1
                    time.sleep(pauses[k % 1000])
                    next_pause += gaps[k % 1000]
        except RingClosedError:
            pass
        stats = ring.statistics()
        report(received=seq, crc=crc, waits=stats.waits, doorbells=stats.doorbells_rung)
        if seq != int(count):
            sys.exit(1)


def hold(spec: str, side: str) -> None:
    """Attach as the sender ('tx') or the receiver ('rx'), then do nothing until killed."""
    with attach(spec) as ring:
        ring.sender() if side == "tx" else ring.receiver()
        report(ready=True)
        signal.pause()


def idle(spec: str, seconds: str) -> None:
    """Wait in receive on an empty ring; report the CPU time that cost."""
    with attach(spec) as ring:
        rx = ring.receiver()
        before = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.monotonic()
        try:
            rx.receive(timeout=float(seconds))
        except TimeoutError:
            pass
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.monotonic() - t0
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        report(cpu=cpu, wall=wall)


def owner(capacity: str) -> None:
    """Own a ring with a child blocked on it; the test SIGKILLs us and watches the child."""
    ring = ShmRing.create(int(capacity))
    spec = msgspec.json.encode(ring.spec).decode()
    child = subprocess.Popen(
        [sys.executable, __file__, "orphan", spec], pass_fds=ring.fds, stdout=subprocess.PIPE
    )
    ring.watch_peer(child.pid)
    assert child.stdout is not None
    child.stdout.readline()  # the child attached
    name = os.readlink(f"/proc/self/fd/{ring.spec.mem_fd}")
    report(child=child.pid, segment=name)
    child.wait()  # until SIGKILL


def orphan(spec: str) -> None:
    """Block on a ring until the owner dies; exit 0 if that was noticed as PeerDiedError."""
    with attach(spec) as ring:
        rx = ring.receiver()
        report(ready=True)
        try:
            rx.receive(timeout=30)  # nobody sends: this waits for the owner's death
        except PeerDiedError:
            sys.exit(0)
    sys.exit(1)


ROLES = {
    "echo": echo,
    "stress-source": stress_source,
    "stress-sink": stress_sink,
    "hold": hold,
    "idle": idle,
    "owner": owner,
    "orphan": orphan,
}

if __name__ == "__main__":
    ROLES[sys.argv[1]](*sys.argv[2:])
