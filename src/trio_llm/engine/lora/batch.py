"""One step's adapter rows: which rows of the packed batch get which adapter's update, grouped.

Built once per step by the model runner from each row's slot (-1: the base model), and passed
to the forward, which calls `add` after each adaptable projection with that projection's input
and output. The base matmul is the step's own, shared by every row; `add` then adds, to the
rows of each adapter, that adapter's low-rank update: the rows are gathered into one group per
adapter ([adapters, rows of the largest group, in], a short group padded with a masked row),
each group multiplied by its own adapter's A and B in one batched matmul per target
(`torch.bmm` over the groups), and the results added back to their rows (`index_add_`). So a
step's cost grows with its adapters' ranks and rows, not with a loop over rows or adapters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from trio_llm.engine.lora.stacks import LoraStacks, Weights

Stage = Callable[[str, np.ndarray], torch.Tensor]
"""Copies a numpy array to the device (the runner's staging buffers, by name)."""


@dataclass(slots=True)
class LoraBatch:
    rows: torch.Tensor
    """[groups * width]: the packed row of each group member, group after group (a pad's: 0)."""
    groups: int
    """Distinct adapters in the step."""
    width: int
    """Rows of the largest group."""
    keep: torch.Tensor | None
    """[groups, width, 1]: 1 for a real member, 0 for a pad (None: no group is padded)."""
    weights: list[Weights]
    """Per target: its A and Bs for the step's adapters, in group order."""
    rank: int
    """The stacks' rank bound: the width of one part in A's rows."""
    whole: bool = False
    """Every row of the step is in the one group, in order: no gather, no scatter."""

    @classmethod
    def build(cls, row_slots: np.ndarray, stacks: LoraStacks, stage: Stage) -> LoraBatch | None:
        """The step's groups from each row's slot (-1: the base model); None when no row has
        an adapter."""
        members = np.flatnonzero(row_slots >= 0)
        if members.size == 0:
            return None
        slots = row_slots[members]
        order = np.argsort(slots, kind="stable")
        members, slots = members[order], slots[order]
        active, counts = np.unique(slots, return_counts=True)
        groups, width = len(active), int(counts.max())
        keep = None
        if groups * width == members.size:
            rows = members
        else:
            group = np.repeat(np.arange(groups), counts)
            within = np.arange(members.size) - np.repeat(np.cumsum(counts) - counts, counts)
            where = group * width + within
            rows = np.zeros(groups * width, dtype=np.int64)
            rows[where] = members
            mask = np.zeros(groups * width, dtype=np.float32)
            mask[where] = 1.0
            keep = stage("lora_keep", mask).view(groups, width, 1).to(stacks.dtype)
        return cls(
            rows=stage("lora_rows", rows.astype(np.int64, copy=False)),
            groups=groups,
            width=width,
            keep=keep,
            weights=stacks.weights(tuple(active.tolist())),
            rank=stacks.max_rank,
            whole=groups == 1 and members.size == row_slots.size,
        )

    def add(self, target: int, x: torch.Tensor, out: torch.Tensor) -> None:
        """Add each group's update to its rows of `out` ([T, out]), the target's output for the
        input `x` ([T, in])."""
        a, bs = self.weights[target]
        if self.whole:
            xs = x.unsqueeze(0)
        else:
            xs = x.index_select(0, self.rows).view(self.groups, self.width, x.shape[-1])
        shrunk = torch.bmm(xs, a.transpose(1, 2))  # [groups, width, parts * rank]
        if self.keep is not None:
            shrunk.mul_(self.keep)
        if len(bs) == 1:
            update = torch.bmm(shrunk, bs[0].transpose(1, 2))
        else:
            r = self.rank
            update = torch.cat(
                [
                    torch.bmm(shrunk[:, :, p * r : (p + 1) * r], b.transpose(1, 2))
                    for p, b in enumerate(bs)
                ],
                dim=2,
            )
        if self.whole:
            out.add_(update[0])
        else:
            out.index_add_(0, self.rows, update.view(self.groups * self.width, -1))
