"""This CPU's feature flags, read once per call from /proc/cpuinfo.

Below everything that chooses by them: the dtype policy and the matmul plans (through
`models.loader.cpu_flags`, which tests fake), the kernel build's key and the recorded timings
(`paged_decode`, `machine_record`), which must follow the real machine.
"""

from __future__ import annotations


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as /proc/cpuinfo names them; empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return frozenset()
    return frozenset(line.partition(":")[2].split())
