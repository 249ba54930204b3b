"""A call's time as the benchmarks under bench/ report it, shared so that each reports alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(call: Callable[[], object], repeats: int) -> float:
    """Milliseconds: the median of `repeats` timed calls after one untimed (whatever the call
    builds or loads on first use, and the caches it warms, stay out of the timing)."""
    call()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3
