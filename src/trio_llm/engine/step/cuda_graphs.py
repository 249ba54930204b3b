"""CUDA graphs for decode-only steps: the model's forward and LM head captured once per padded
batch size at start-up, replayed with one launch.

Why: a decode step of a small model on a large GPU is bound by kernel launches (a few per layer,
each several microseconds of host time) rather than by the GPU; a replayed graph launches them
all at once. Only decode-only steps qualify: their shapes depend on the batch size alone, so a
handful of sizes covers them (a step of B sequences runs in the graph of the smallest captured
size >= B, the extra rows padding). Mixed prefill steps, steps that score prompt tokens, steps
larger than the largest size, and every step on a CPU run eagerly.

What it owns: the static buffers the graphs read (token ids, positions, slot mapping, block
tables, context lengths at the largest size), one graph per size sharing one memory pool, and
their logits outputs. Memory: the pool holds the largest size's activations and logits, once;
`capture` logs what it took.

Invariants: a graph reads only the static buffers; a replay writes a step's rows into their
first B rows and keeps rows past B as padding (slot -1: no K/V written; context 0: the decode
kernel gives zeros; token and position 0), which is what the sizes were captured with; sampling
stays outside the graphs (its work depends on the requests' parameters).

Importable without CUDA: `capture_sizes`, `padded_size` and `StaticInputs` (the bookkeeping)
run and are tested on a CPU; only `DecodeGraphs.capture` needs a GPU.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from trio_llm.engine.attention.triton_backend import TritonAttentionMetadata

log = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 256
"""The largest batch captured: past it a step's launches are a small share of its time."""

Forward = Callable[[Tensor, Tensor, TritonAttentionMetadata], Tensor]
"""(token ids [B], positions [B], metadata) -> logits [B, V]: what a graph captures."""


def capture_sizes(max_num_seqs: int, limit: int = MAX_CAPTURE_SIZE) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to min(max_num_seqs, limit), and that bound itself:
    a step pads at most 7 rows (vLLM's choice), and the graphs stay few."""
    top = max(1, min(max_num_seqs, limit))
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, top + 1, 8))
    if sizes[-1] != top:
        sizes.append(top)
    return sizes


def padded_size(sizes: list[int], batch: int) -> int | None:
    """The smallest captured size that holds `batch` rows; None when none does."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) and batch > 0 else None


class StaticInputs:
    """The buffers every graph reads, at the largest size, and which of their rows hold a
    step's values (the rest hold padding)."""

    def __init__(self, max_size: int, max_blocks: int, device: torch.device) -> None:
        self.max_size = max_size
        self.input_ids = torch.zeros(max_size, dtype=torch.long, device=device)
        self.positions = torch.zeros(max_size, dtype=torch.long, device=device)
        self.slot_mapping = torch.full((max_size,), -1, dtype=torch.long, device=device)
        self.block_tables = torch.zeros(max_size, max_blocks, dtype=torch.int32, device=device)
        self.context_lens = torch.zeros(max_size, dtype=torch.int32, device=device)
        self.filled = 0
        """Rows holding the last step's values; rows from here on are padding."""

    def fill(
        self,
        input_ids: Tensor,
        positions: Tensor,
        slot_mapping: Tensor,
        block_tables: Tensor,
        context_lens: Tensor,
    ) -> None:
        """One step's B rows into the first B, device to device; rows the previous step
        filled past B become padding again. A table narrower than the buffer leaves the rest
        of its columns as they were: the kernels read no column past a context's blocks."""
        n = input_ids.shape[0]
        if n > self.max_size:
            raise ValueError(f"{n} rows do not fit the static buffers of {self.max_size}")
        self.input_ids[:n].copy_(input_ids, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.slot_mapping[:n].copy_(slot_mapping, non_blocking=True)
        self.block_tables[:n, : block_tables.shape[1]].copy_(block_tables, non_blocking=True)
        self.context_lens[:n].copy_(context_lens, non_blocking=True)
        if self.filled > n:
            self.pad(n, self.filled)
        self.filled = n

    def pad(self, start: int, end: int) -> None:
        self.input_ids[start:end] = 0
        self.positions[start:end] = 0
        self.slot_mapping[start:end] = -1
        self.context_lens[start:end] = 0

    def metadata(self, size: int) -> TritonAttentionMetadata:
        """A decode-only step's metadata over the first `size` rows (views: what a graph
        captured at `size` reads)."""
        return TritonAttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            num_decodes=size,
            block_tables=self.block_tables[:size],
            context_lens=self.context_lens[:size],
            cu_seqlens_q=self.context_lens[:0].new_zeros(1),
        )


@dataclass(slots=True)
class Captured:
    """One size's graph and the logits buffer its replays write."""

    graph: torch.cuda.CUDAGraph
    logits: Tensor


class DecodeGraphs:
    """One captured graph per size; `run` replays the one a decode-only step fits."""

    def __init__(self, sizes: list[int], max_blocks: int, device: torch.device) -> None:
        self.sizes = sorted(sizes)
        self.static = StaticInputs(self.sizes[-1], max_blocks, device)
        self.graphs: dict[int, Captured] = {}
        self.replays = 0
        """Steps run from a graph."""
        self.memory_bytes = 0
        """GPU memory the capture took (the pool and the static buffers)."""

    def capture(self, forward: Forward) -> None:
        """Every size, largest first (the smaller ones then fit in the pool it grew), each
        after one eager run on the padding (Triton compiles, cuBLAS picks its kernels)."""
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA device")
        torch.cuda.synchronize()
        started = time.perf_counter()
        free_before = torch.cuda.mem_get_info()[0]
        pool = torch.cuda.graph_pool_handle()
        static = self.static
        for size in reversed(self.sizes):
            meta = static.metadata(size)
            ids, pos = static.input_ids[:size], static.positions[:size]
            forward(ids, pos, meta)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                logits = forward(ids, pos, meta)
            self.graphs[size] = Captured(graph, logits)
        torch.cuda.synchronize()
        self.memory_bytes = max(0, free_before - torch.cuda.mem_get_info()[0])
        log.info(
            "captured CUDA graphs for decode steps of %s sequences: %.0f MiB, %.1f s",
            ",".join(map(str, self.sizes)),
            self.memory_bytes / 2**20,
            time.perf_counter() - started,
        )

    def run(self, input_ids: Tensor, positions: Tensor, meta: TritonAttentionMetadata) -> Tensor:
        """Logits [B, V] of a decode-only step of B rows (B <= the largest size)."""
        n = input_ids.shape[0]
        size = padded_size(self.sizes, n)
        assert size is not None, "run only steps that `fits`"
        self.static.fill(
            input_ids, positions, meta.slot_mapping, meta.block_tables, meta.context_lens
        )
        captured = self.graphs[size]
        captured.graph.replay()
        self.replays += 1
        return captured.logits[:n]

    def fits(self, num_rows: int, num_decodes: int) -> bool:
        """Whether a step of `num_rows` packed rows, `num_decodes` of them decodes, replays."""
        return num_rows == num_decodes and padded_size(self.sizes, num_rows) is not None
