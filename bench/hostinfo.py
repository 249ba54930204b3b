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


def describe() -> str:
    """CPU, cores, Python, OS and date on one line."""
    return (
        f"{cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.system()}, {datetime.date.today().isoformat()}"
    )
