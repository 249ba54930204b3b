"""What every benchmark's report says about the machine it ran on (one place for all of them)."""

from __future__ import annotations

import datetime
import os
import platform


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_class() -> str:
    """Which of the pool's machine classes this is: the flags that decide bf16 and the kernels."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return "flags unknown"
    flags = set(line.partition(":")[2].split())
    if "amx_bf16" in flags:
        return "AMX + AVX512-BF16"
    if "avx512_bf16" in flags:
        return "AVX512-BF16"
    if "avx512f" in flags:
        return "AVX-512 (no BF16)"
    return "AVX2-only" if "avx2" in flags else "no AVX2"


def describe() -> str:
    """CPU (and its class), cores, Python, OS and date on one line."""
    return (
        f"{cpu_name()} ({cpu_class()}), {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, "
        f"{platform.system()}, {datetime.date.today().isoformat()}"
    )
