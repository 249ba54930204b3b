"""The persistent input batch: each running sequence's tokens, block table and sampling
parameters as rows of numpy arrays that live across steps.

Why: a step used to rebuild its inputs from the sequences' Python lists (every scheduled token,
every block table, every sampling parameter), and on CUDA then copied each array from pageable
memory. Here a sequence gets a row when it is first scheduled; later steps only append to it
(the token sampled last step, a new block every `block_size` tokens), and a step's inputs are
numpy gathers over the rows. On CUDA the step's arrays go through pinned staging buffers with
non-blocking copies, and the sampled tokens come back the same way, with one sync.

What it owns: the row of every sequence the scheduler has running (by identity: a row holds its
sequence, so no id is reused while it is held), the free rows, and the staging buffers.

Invariants: a row's `num_tokens` / `num_blocks` entries count the tokens and blocks of its
sequence that the row holds, which are equal to the sequence's own (`sync` appends the rest);
a row's block-table entries past its blocks are 0, as the old per-step tables were padded.
A sequence leaves its row when the scheduler reports it removed (finished or preempted): a
preempted sequence's table is cleared and refilled, so it comes back as a fresh row.
Staging buffers are reused every step: a buffer's host memory is rewritten only after its last
copy is done (an event per buffer; usually long done, since a step waits for its tokens).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from trio_llm.engine.step.sequence import Sequence

_MIN_TOKENS = 256
"""Token columns a fresh table starts with; it doubles when a sequence outgrows it."""


@dataclass(frozen=True, slots=True)
class SamplingColumns:
    """The sampling parameters of a step's sampled rows, gathered from the persistent rows."""

    greedy: np.ndarray
    """[B] bool."""
    temperature: np.ndarray
    """[B] float32, 1.0 on greedy rows."""
    top_k: np.ndarray
    """[B] int64, 0 where disabled."""
    top_p: np.ndarray
    """[B] float32."""
    min_p: np.ndarray
    """[B] float32."""
    tokens: PenaltyTokens | None = None
    """Where the rows' tokens are held, for the penalties (None: read them off the sequences)."""

    @classmethod
    def of(cls, seqs: Iterable[Sequence]) -> SamplingColumns:
        """The columns read from the sequences themselves (a batch without persistent rows)."""
        params = [s.params for s in seqs]
        return cls(
            greedy=np.array([p.greedy for p in params], dtype=bool),
            temperature=np.array(
                [1.0 if p.greedy else p.temperature for p in params], dtype=np.float32
            ),
            top_k=np.array([max(p.top_k, 0) for p in params], dtype=np.int64),
            top_p=np.array([p.top_p for p in params], dtype=np.float32),
            min_p=np.array([p.min_p for p in params], dtype=np.float32),
        )


@dataclass(frozen=True, slots=True)
class PenaltyTokens:
    """The persistent rows' tokens, read for the penalized rows of a step only: the contexts
    and outputs as padded arrays from numpy slices, not from each sequence's Python lists
    (which rebuilt every penalized sequence's whole context every step)."""

    token_ids: np.ndarray
    """The input batch's [rows, width] token table (not a copy)."""
    num_tokens: np.ndarray
    """[B] tokens held by each sampled row's persistent row."""
    num_prompt_tokens: np.ndarray
    """[B] of those, the prompt's."""
    rows: np.ndarray
    """[B] each sampled row's persistent row."""

    def padded(self, index: np.ndarray, pad: int) -> tuple[np.ndarray, np.ndarray]:
        """([P, width] contexts, [P, width] outputs) of sampled rows `index`, padded with
        `pad` (an id past the vocabulary, which the penalties' scatter drops)."""
        held = self.num_tokens[index]
        width = max(1, int(held.max(initial=0)))
        ids = self.token_ids[self.rows[index], :width]
        column = np.arange(width)[None, :]
        inside = column < held[:, None]
        context = np.where(inside, ids, pad)
        output = np.where(inside & (column >= self.num_prompt_tokens[index][:, None]), ids, pad)
        return context, output


class Staging:
    """Per-name pinned host buffers and device buffers that a step's arrays are copied through.

    On a CPU device nothing is copied: `to_device` hands back the array's own memory."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.pin = self.cuda and torch.cuda.is_available()
        self._host: dict[str, torch.Tensor] = {}
        self._device: dict[str, torch.Tensor] = {}
        self._copied: dict[str, torch.cuda.Event] = {}
        """Per buffer, recorded after its last copy: its host memory is not rewritten before
        the copy has read it (a step that samples nothing ends without a sync)."""

    def to_device(self, name: str, array: np.ndarray) -> torch.Tensor:
        """`array` on the device, through buffer `name` (reused by the next call with it)."""
        if not self.cuda:
            return torch.from_numpy(np.ascontiguousarray(array))
        pending = self._copied.get(name)
        if pending is not None:
            pending.synchronize()
        host = self._buffer(self._host, name, array, pin=self.pin, device=torch.device("cpu"))
        host.numpy()[...] = array
        dev = self._buffer(self._device, name, array, pin=False, device=self.device)
        dev.copy_(host, non_blocking=True)
        if self.pin:
            event = self._copied.setdefault(name, torch.cuda.Event())
            event.record(torch.cuda.current_stream(self.device))
        return dev

    def to_host(self, name: str, tensor: torch.Tensor) -> np.ndarray:
        """`tensor` (on the device) in host memory, after one non-blocking copy and one sync.
        The array is the staging buffer's: read it before the next call with this name."""
        if not self.cuda:
            return tensor.numpy()
        host = self._host_like(name, tensor)
        host.copy_(tensor, non_blocking=True)
        torch.cuda.current_stream(self.device).synchronize()
        return host.numpy()

    def _host_like(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        buf = self._host.get(name)
        need = tensor.numel()
        if buf is None or buf.numel() < need or buf.dtype != tensor.dtype:
            buf = torch.empty(max(need, 64), dtype=tensor.dtype, pin_memory=self.pin)
            self._host[name] = buf
        return buf[:need].view(tensor.shape)

    @staticmethod
    def _buffer(
        pool: dict[str, torch.Tensor],
        name: str,
        array: np.ndarray,
        *,
        pin: bool,
        device: torch.device,
    ) -> torch.Tensor:
        dtype = torch.from_numpy(array[:0].reshape(-1)).dtype
        need = array.size
        buf = pool.get(name)
        if buf is None or buf.numel() < need or buf.dtype != dtype:
            # Grown by doubling: a step a little larger than the last does not reallocate.
            size = max(need, 2 * (buf.numel() if buf is not None else 32))
            buf = torch.empty(size, dtype=dtype, device=device, pin_memory=pin)
            pool[name] = buf
        return buf[:need].view(array.shape)


class InputBatch:
    """The rows of the running sequences; see the module docstring."""

    def __init__(self, block_size: int, max_model_len: int, rows: int = 16) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_blocks = -(-max_model_len // block_size)
        self.row_of: dict[Sequence, int] = {}
        self._free: list[int] = []
        self.token_ids = np.zeros((0, 0), dtype=np.int64)
        self.block_table = np.zeros((0, 0), dtype=np.int64)
        self.num_tokens = np.zeros(0, dtype=np.int64)
        """Tokens held per row (prompt and output so far)."""
        self.num_prompt_tokens = np.zeros(0, dtype=np.int64)
        self.num_blocks = np.zeros(0, dtype=np.int64)
        self.greedy = np.zeros(0, dtype=bool)
        self.temperature = np.zeros(0, dtype=np.float32)
        self.top_k = np.zeros(0, dtype=np.int64)
        self.top_p = np.zeros(0, dtype=np.float32)
        self.min_p = np.zeros(0, dtype=np.float32)
        self.prompt_logprobs = np.zeros(0, dtype=bool)
        """Rows whose request asked for prompt logprobs."""
        self._grow_rows(rows)
        self._grow_columns(_MIN_TOKENS)

    def __len__(self) -> int:
        return len(self.row_of)

    # -- rows -------------------------------------------------------------------------------

    def remove(self, seqs: Iterable[Sequence]) -> None:
        """Free the rows of sequences that left the running set (unknown ones are ignored)."""
        for seq in seqs:
            row = self.row_of.pop(seq, None)
            if row is None:
                continue
            self.block_table[row, : self.num_blocks[row]] = 0
            self.num_tokens[row] = self.num_blocks[row] = 0
            self._free.append(row)

    def sync(self, seqs: list[Sequence]) -> np.ndarray:
        """The rows of `seqs` (a step's sequences, in its order), each brought up to date with
        its sequence: new sequences get a row, known ones get the tokens and blocks appended
        since the last step."""
        state = np.fromiter(
            ((self.row_of.get(s, -1), len(s.token_ids), len(s.block_table)) for s in seqs),
            np.dtype((np.int64, 3)),
            len(seqs),
        )
        rows, lengths, tables = state[:, 0].copy(), state[:, 1], state[:, 2]
        new = (rows < 0).nonzero()[0]
        for i in new.tolist():
            rows[i] = self._add(seqs[i])
        grown = (lengths != self.num_tokens[rows]).nonzero()[0]
        if len(grown):
            self._append_tokens(seqs, rows, lengths, grown)
        for i in (tables != self.num_blocks[rows]).nonzero()[0].tolist():
            self._set_blocks(int(rows[i]), seqs[i].block_table)
        return rows

    def _add(self, seq: Sequence) -> int:
        if not self._free:
            self._grow_rows(2 * len(self.num_tokens))
        row = self._free.pop()
        self.row_of[seq] = row
        self._set_tokens(row, seq.token_ids, 0)
        self._set_blocks(row, seq.block_table)
        p = seq.params
        self.greedy[row] = p.greedy
        self.temperature[row] = 1.0 if p.greedy else p.temperature
        self.top_k[row] = max(p.top_k, 0)
        self.top_p[row] = p.top_p
        self.min_p[row] = p.min_p
        self.prompt_logprobs[row] = seq.prompt_logprobs is not None
        self.num_prompt_tokens[row] = seq.num_prompt_tokens
        return row

    def _append_tokens(
        self, seqs: list[Sequence], rows: np.ndarray, lengths: np.ndarray, grown: np.ndarray
    ) -> None:
        """The usual case, one token more than last step, in one scatter; any other in full."""
        held = self.num_tokens[rows[grown]]
        one = lengths[grown] == held + 1
        if one.all() and lengths[grown].max() <= self.token_ids.shape[1]:
            last = np.fromiter((seqs[i].token_ids[-1] for i in grown.tolist()), np.int64)
            self.token_ids[rows[grown], held] = last
            self.num_tokens[rows[grown]] = held + 1
            return
        for i in grown.tolist():
            row, held_i = int(rows[i]), int(self.num_tokens[rows[i]])
            start = held_i if held_i < lengths[i] else 0
            self._set_tokens(row, seqs[i].token_ids[start:], start)

    def _set_tokens(self, row: int, tokens: list[int], start: int) -> None:
        end = start + len(tokens)
        if end > self.token_ids.shape[1]:
            self._grow_columns(end)
        self.token_ids[row, start:end] = tokens
        self.num_tokens[row] = end

    def _set_blocks(self, row: int, table: list[int]) -> None:
        held = int(self.num_blocks[row])
        if len(table) < held:  # cleared and refilled (never so while it holds the row)
            self.block_table[row, :held] = 0
            held = 0
        if len(table) > self.block_table.shape[1]:
            self._grow_blocks(len(table))
        self.block_table[row, held : len(table)] = table[held:]
        self.num_blocks[row] = len(table)

    # -- a step's arrays --------------------------------------------------------------------

    def tables(self, rows: np.ndarray) -> np.ndarray:
        """[B, widest table] block tables of `rows`, padded with block 0."""
        width = int(self.num_blocks[rows].max(initial=0))
        return self.block_table[rows, :width]

    def sampling(self, rows: np.ndarray) -> SamplingColumns:
        return SamplingColumns(
            greedy=self.greedy[rows],
            temperature=self.temperature[rows],
            top_k=self.top_k[rows],
            top_p=self.top_p[rows],
            min_p=self.min_p[rows],
            tokens=PenaltyTokens(
                self.token_ids, self.num_tokens[rows], self.num_prompt_tokens[rows], rows
            ),
        )

    # -- growth -----------------------------------------------------------------------------

    def _grow_rows(self, size: int) -> None:
        old = len(self.num_tokens)
        if size <= old:
            return
        self.token_ids = _grown(self.token_ids, (size, self.token_ids.shape[1]))
        self.block_table = _grown(self.block_table, (size, self.block_table.shape[1]))
        for name in (
            "num_tokens",
            "num_prompt_tokens",
            "num_blocks",
            "greedy",
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "prompt_logprobs",
        ):
            setattr(self, name, _grown(getattr(self, name), (size,)))
        self._free.extend(range(size - 1, old - 1, -1))  # lowest rows first

    def _grow_columns(self, need: int) -> None:
        width = max(_MIN_TOKENS, self.token_ids.shape[1])
        while width < need:
            width *= 2
        self.token_ids = _grown(self.token_ids, (len(self.num_tokens), width))
        self._grow_blocks(-(-width // self.block_size))

    def _grow_blocks(self, need: int) -> None:
        if need > self.block_table.shape[1]:
            width = max(need, 2 * self.block_table.shape[1])
            self.block_table = _grown(self.block_table, (len(self.num_tokens), width))


def _grown(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """`array` copied into the top-left corner of zeros of `shape`."""
    out = np.zeros(shape, dtype=array.dtype)
    out[tuple(slice(0, n) for n in array.shape)] = array
    return out
