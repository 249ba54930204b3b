"""What every benchmark's report says about the machine it ran on and the command that wrote it
(one place for all of them).

    python bench/hostinfo.py        # the machine line, as the reports write it

Every bench script imports this module by its name, after putting bench/ on the path (each
entry point's first lines do: `python bench/<folder>/<script>.py` puts only <folder> there).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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


def machine() -> str:
    """`describe()` and the torch build, for the reports of what runs torch."""
    import torch

    return f"{describe()}; torch {torch.__version__}"


def heading(title: str, details: str = "") -> list[str]:
    """A report's first lines: its title, the command that wrote it, then the machine (with
    torch) and the date, `details` after them on the same line."""
    when = datetime.datetime.now().isoformat(timespec="minutes")
    return [
        f"# {title}",
        "",
        f"Command: `{command()}`",
        "",
        f"Machine: {machine()}. Date: {when}. {details}".rstrip(),
    ]


def command() -> str:
    """This run's command as a user types it at the repository's root: `python bench/...py` and
    the arguments it was given (what a report's "Command:" line says)."""
    script = Path(sys.argv[0]).resolve()
    if script.is_relative_to(REPO):
        script = script.relative_to(REPO)
    return shlex.join(["python", str(script), *sys.argv[1:]])


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    print(describe())
