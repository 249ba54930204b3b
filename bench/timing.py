"""A call's time as the benchmarks under bench/ report it, shared so that each reports alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(
    call: Callable[[], object], repeats: int, before: Callable[[], object] | None = None
) -> float:
    """Milliseconds: the median of `repeats` timed calls after one untimed (whatever the call
    builds or loads on first use, and the caches it warms, stay out of the timing); `before`:
    untimed work before each timed call."""
    call()
    samples = []
    for _ in range(repeats):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def medians_us(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Microseconds per variant: the median of `repeats` timed calls of each, after one untimed
    call each, the variants taking turns call by call, so that drift on a shared VM (its memory
    read rate moved between 33 and 60 GB/s within an hour here) falls on all of them alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}
