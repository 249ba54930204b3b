"""`--dtype auto` on a CPU: bfloat16 only where it is measured to be no slower for a lone stream.

The CPU's flags say whether bfloat16 can be fast (AVX512-BF16, AMX), not whether it is for this
model's shapes on this machine: on an AMX Xeon the 30 layers of SmolLM2-135M took 40 ms in bf16
against 100 ms in fp32 at 32 rows, but a lone stream was slower in bf16 (ITL 56.5 against
45.1 ms). A server that picks bf16 for its batches must not make the single user slower, and
the weights cannot differ between lone and batched steps without giving up batch invariance.
So where the flags allow bf16, the engine times the model's own matmuls (one layer's and the LM
head's weights, cast to each dtype) at one row and at 32, with its thread count, and takes bf16
only if it is no slower at one row and faster at 32. The choice is kept in a per-machine cache
(keyed by CPU, torch, thread count and shapes), so that an engine restarted on the same machine
makes the same choice rather than a new, noisy one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

log = logging.getLogger(__name__)

ROWS = (1, 32)
REPEATS = 7


def _cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "trio-llm" / "dtype-choice.json"


def _key(weights: list[Tensor], flags: frozenset[str]) -> str:
    shapes = sorted({tuple(w.shape) for w in weights})
    text = json.dumps(
        [platform.processor(), sorted(flags), torch.__version__, torch.get_num_threads(), shapes]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _timings(weights: list[Tensor], dtype: torch.dtype) -> dict[int, float]:
    """Median seconds of one pass over `weights` at each row count of ROWS."""
    cast = [w.detach().to(dtype) for w in weights]
    out = {}
    for rows in ROWS:
        xs = {w.shape[1]: torch.randn(rows, w.shape[1]).to(dtype) for w in cast}
        for w in cast:  # warm up: the first call of a shape plans its kernel
            F.linear(xs[w.shape[1]], w)
        samples = []
        for _ in range(REPEATS):
            started = time.perf_counter()
            for w in cast:
                F.linear(xs[w.shape[1]], w)
            samples.append(time.perf_counter() - started)
        out[rows] = statistics.median(samples)
    return out


def choose_cpu_dtype(weights: list[Tensor], flags: frozenset[str]) -> torch.dtype:
    """bfloat16 or float32 for a CPU engine whose CPU can do bf16 fast (per its `flags`):
    measured once per machine on `weights` (a layer's matmul weights and the LM head's)."""
    cache = _cache_file()
    key = _key(weights, flags)
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if isinstance(known, dict) and known.get(key) in ("float32", "bfloat16"):
        return getattr(torch, known[key])
    fp32, bf16 = _timings(weights, torch.float32), _timings(weights, torch.bfloat16)
    lone, batched = ROWS
    choice = (
        torch.bfloat16
        if bf16[lone] <= fp32[lone] and bf16[batched] < fp32[batched]
        else torch.float32
    )
    log.info(
        "dtype auto: %s (matmuls of one layer and the LM head, bf16 against fp32: %.2f against "
        "%.2f ms at 1 row, %.2f against %.2f ms at %d rows)",
        str(choice).removeprefix("torch."),
        bf16[lone] * 1e3,
        fp32[lone] * 1e3,
        bf16[batched] * 1e3,
        fp32[batched] * 1e3,
        batched,
    )
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        known = known if isinstance(known, dict) else {}
        known[key] = str(choice).removeprefix("torch.")
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, cache)
    except OSError as error:
        log.info("cannot record the dtype choice in %s: %s", cache, error)
    return choice
