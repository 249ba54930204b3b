"""Dense copies of quantized weights, for the calls of many rows that their kernels lose.

Why: the quantized kernels read a quarter (int4) or half (int8) of a bf16 matrix's bytes, which
wins while a call is memory-bound (a lone stream's decode), but they dequantize a weight tile for
every few rows, so their cost grows with the rows: measured on the AMD EPYC (AVX512-BF16, 2
threads) a decode batch of 32 rows took 2x bf16's time in the layers and 2.7x in the LM head
(bench/results/quant_kernels.md), and a prefill chunk dequantized each weight per call. So a
quantized model keeps, where memory allows, each matrix dequantized once at start-up, and every
call of at least that matrix's crossover rows multiplies the dense copy (quant.dispatching).

The crossover is measured here, per distinct matrix shape, on this machine: the quantized
kernel and the dense matmul timed at 1, 2, 4, ... rows, the crossover the first count where the
dense one is faster (oneDNN's bf16 matmul and torch's int4 kernel differ by CPU class: AMX,
AVX512-BF16, AVX2). The engine records it per machine (engine/ops/machine_record.py) and later
starts take it from there: the crossover decides the kernel, and so the rounding, of a row.
The copies are packed into oneDNN's blocked layout once (`ops.matmul.pack`), which `F.linear`
would redo on every call. The copies are in the dtype
the quantized kernels multiply in (`quant.kernel_dtype`: bf16 for a float32 model too).

What it costs: the copies' memory (the model in the activations' dtype beside its quantized
form; refused beyond a share of the available memory, and then prefill chunks dequantize per
call as before), and batch invariance: a row's result depends on which kernel its call took,
so this runs only where invariance is off (`--batch-invariant on` keeps every row on the
row-exact quantized kernels, at the measured price).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from trio_llm.engine.ops.machine_record import MachineRecord, machine_key
from trio_llm.engine.ops.matmul import Weight, banded, multiply, pack
from trio_llm.engine.quant import NEVER_DENSE, Int8Weight, QuantizedWeight, is_quantized

log = logging.getLogger(__name__)

MEMORY_SHARE = 0.25
"""The copies may take at most this share of the memory available at start-up."""
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64)
"""Row counts timed for a crossover; a matrix whose kernel still wins at the last is timed at
`CHUNK_ROWS` too, and keeps its copy for calls from twice the last on if it loses there."""
CHUNK_ROWS = 512
"""A prefill chunk's rows: a kernel that beats the copy here too keeps no copy (`NEVER_DENSE`).
The integer row-exact kernel does on an AMD EPYC: 0.7-0.85x oneDNN's bf16 time at 512 rows
(bench/results/int_rows_epyc.md), where a copy from 128 rows made prefill slower."""
PROBE_REPEATS = 3


@dataclass(frozen=True, slots=True)
class DenseCopies:
    kept: bool
    nbytes: int
    crossovers: dict[tuple[int, int], int]
    """(out_features, in_features) -> rows from which a call takes the dense copy."""
    reason: str

    def describe(self) -> str:
        if not self.kept:
            return f"quantized kernels for every call ({self.reason})"
        rows = ", ".join(
            f"{n}x{k} " + ("never" if r == NEVER_DENSE else f"from {r}")
            for (n, k), r in sorted(self.crossovers.items())
        )
        return (
            f"dense copies ({self.nbytes / 2**20:.0f} MiB) for calls of many rows ({rows} "
            f"rows; {self.reason})"
        )


def available_memory() -> int | None:
    """Bytes the kernel says are available (MemAvailable), or None where it does not say."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def keep(
    weights: Iterable[object],
    dtype: torch.dtype,
    *,
    available: int | None,
    timer: Callable[[Callable[[], object]], float] | None = None,
    record: MachineRecord | None = None,
) -> DenseCopies:
    """Give each distinct quantized weight in `weights` its dense copy in `dtype` and its
    crossover, where the copies fit in MEMORY_SHARE of `available` bytes (None: unknown, kept).
    `timer` times a call in seconds (the best of PROBE_REPEATS by default); tests fake it.
    `record`: crossovers measured on this machine before are taken from it, new ones written
    to it (engine/ops/machine_record.py: a restart then picks the same kernels, and answers a
    greedy request alike)."""
    distinct = list(
        {
            id(w): w
            for w in weights
            if is_quantized(w) and not (isinstance(w, Int8Weight) and w.int8_activations)
        }.values()
    )
    # Banded copies (`ops.matmul.banded`) hold each matrix twice.
    elem = torch.tensor([], dtype=dtype).element_size() * (2 if banded(dtype) else 1)
    nbytes = sum(w.shape[0] * w.shape[1] * elem for w in distinct)  # type: ignore[union-attr]
    if not distinct:
        return DenseCopies(False, 0, {}, "no quantized weights")
    if available is not None and nbytes > MEMORY_SHARE * available:
        return DenseCopies(
            False,
            nbytes,
            {},
            f"their dense copies would take {nbytes / 2**20:.0f} MiB, over "
            f"{MEMORY_SHARE:.0%} of the {available / 2**20:.0f} MiB available; prefill chunks "
            "dequantize per call",
        )
    groups: dict[tuple[int, int], list[tuple[QuantizedWeight, Weight]]] = {}
    for weight in distinct:
        assert is_quantized(weight)
        dense = pack(weight.dequantize().to(dtype))  # type: ignore[union-attr]
        groups.setdefault((int(dense.shape[0]), int(dense.shape[1])), []).append(
            (weight, dense)  # type: ignore[arg-type]
        )
    crossovers: dict[tuple[int, int], int] = {}
    recalled = 0
    for shape, pairs in groups.items():

        def measure(pairs: list[tuple[QuantizedWeight, Weight]] = pairs) -> int:
            return crossover(pairs, timer or _best_time)

        if record is None:
            crossovers[shape] = measure()
            continue
        kinds = sorted(
            {(type(w).__name__, getattr(w, "group", None), w.exact is not None) for w, _ in pairs}
        )
        for packing in {type(w.exact) for w, _ in pairs if w.exact is not None}:
            kinds.append((packing.__name__, packing.build_key()))  # timed against this build
        key = machine_key(
            "dense crossover",
            (*PROBE_ROWS, CHUNK_ROWS),
            shape,
            len(pairs),
            str(dtype),
            kinds,
            type(pairs[0][1]).__name__,  # the copies' form: timed against this one
        )
        crossovers[shape], known = record.recall_or_measure(key, measure)
        recalled += known
    for shape, pairs in groups.items():
        for weight, dense in pairs:
            never = crossovers[shape] == NEVER_DENSE
            weight.dense, weight.dense_rows = None if never else dense, crossovers[shape]
    nbytes = sum(
        shape[0] * shape[1] * elem * len(groups[shape])
        for shape, rows in crossovers.items()
        if rows != NEVER_DENSE
    )
    if record is None:
        how = "crossovers measured at start-up"
    elif recalled == len(groups):
        how = f"crossovers as measured on this machine before ({record.path})"
    else:
        how = f"crossovers measured at start-up, recorded in {record.path}"
    if not nbytes:
        return DenseCopies(False, 0, crossovers, f"the kernels beat them at every size; {how}")
    return DenseCopies(True, nbytes, crossovers, how)


def crossover(
    pairs: list[tuple[QuantizedWeight, Weight]],
    timer: Callable[[Callable[[], object]], float],
) -> int:
    """The fewest rows at which the dense matmuls are at least as fast as the quantized kernels,
    timed as a step calls them: one call on each matrix of the shape in turn (the model's
    layers), so each reads its weight from memory rather than from a cache the previous call
    warmed, which would hide what the quantized form saves."""
    width = pairs[0][1].shape[1]

    def dense_wins(rows: int) -> bool:
        x = torch.randn(rows, width).to(pairs[0][1].dtype)  # type: ignore[union-attr]

        def kernels() -> None:
            for weight, _ in pairs:
                weight.matmul(x, None)

        def plain() -> None:
            for _, dense in pairs:
                multiply(x, dense)

        return timer(plain) <= timer(kernels)

    for rows in PROBE_ROWS:
        if dense_wins(rows):
            return rows
    return 2 * PROBE_ROWS[-1] if dense_wins(CHUNK_ROWS) else NEVER_DENSE


def _best_time(fn: Callable[[], object]) -> float:
    fn()  # first-call costs (oneDNN's primitive cache) are not the steady state
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
