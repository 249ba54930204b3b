"""Every adapter slot's weights, stacked per target, so that one step's adapters are a batched
matmul per target, whatever their number.

Each target (targets.py) holds `A`: [slots, parts * R, in] (part p's rows at p*R) and, per
part, `B`: [slots, out_p, R], R being the rank bound: a slot's adapter of a smaller rank (or
one that leaves a part out) is zero-padded, and a zero row of A meets a zero column of B, so
the padding adds exact zeros. The memory is taken once, at start (`max_loras` slots of rank
`max_lora_rank`), like the KV cache: loading an adapter writes its slot, nothing is allocated.

Invariant: a slot's rows hold exactly the adapter written there last (zeros where it has no
pair), and `weights` never returns a copy made before the latest write.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trio_llm.engine.lora.adapter import Adapter
from trio_llm.engine.lora.targets import Target

Weights = tuple[torch.Tensor, list[torch.Tensor]]
"""One target's A and per-part Bs for the adapters of one step, in slot order."""

_GATHERED_KEPT = 8
"""Sets of slots whose weights (views, or copies for a set that is not a contiguous range) are
kept at once."""


class LoraStacks:
    def __init__(
        self,
        targets: Sequence[Target],
        max_loras: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.targets = list(targets)
        self.max_loras = max_loras
        self.max_rank = max_rank
        self.dtype = dtype
        self.device = device
        self.modules: dict[str, tuple[int, int]] = {}
        """Adaptable module path -> (in_features, out_features): what adapters are checked
        against."""
        self._place: dict[str, tuple[int, int]] = {}
        """Module path -> (target index, part index)."""
        self.a: list[torch.Tensor] = []
        self.b: list[list[torch.Tensor]] = []
        for t, target in enumerate(self.targets):
            for p, part in enumerate(target.parts):
                self.modules[part.module] = (target.in_features, part.out_features)
                self._place[part.module] = (t, p)
            shape = (max_loras, len(target.parts) * max_rank, target.in_features)
            self.a.append(torch.zeros(shape, dtype=dtype, device=device))
            self.b.append(
                [
                    torch.zeros(max_loras, part.out_features, max_rank, dtype=dtype, device=device)
                    for part in target.parts
                ]
            )
        self._gathered: dict[tuple[int, ...], list[Weights]] = {}

    @property
    def nbytes(self) -> int:
        tensors = [*self.a, *(b for bs in self.b for b in bs)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def write(self, slot: int, adapter: Adapter) -> None:
        """Put `adapter` (read against `modules`, within `max_rank`) in `slot`."""
        self.clear(slot)
        r_max = self.max_rank
        for module, pair in adapter.pairs.items():
            t, p = self._place[module]
            self.a[t][slot, p * r_max : p * r_max + pair.rank].copy_(pair.a)
            self.b[t][p][slot, :, : pair.rank].copy_(pair.b)

    def clear(self, slot: int) -> None:
        for a, bs in zip(self.a, self.b, strict=True):
            a[slot].zero_()
            for b in bs:
                b[slot].zero_()
        self._gathered.clear()

    def weights(self, slots: tuple[int, ...]) -> list[Weights]:
        """Every target's weights for `slots` (ascending): views when they are a contiguous
        range, else copies; kept until the next write, so a steady batch reuses them."""
        kept = self._gathered.get(slots)
        if kept is not None:
            return kept
        if len(self._gathered) >= _GATHERED_KEPT:
            self._gathered.clear()
        first, last = slots[0], slots[-1]
        if last - first + 1 == len(slots):
            end = last + 1
            kept = [
                (a[first:end], [b[first:end] for b in bs])
                for a, bs in zip(self.a, self.b, strict=True)
            ]
        else:
            index = torch.tensor(slots, device=self.device)
            kept = [
                (a.index_select(0, index), [b.index_select(0, index) for b in bs])
                for a, bs in zip(self.a, self.b, strict=True)
            ]
        self._gathered[slots] = kept
        return kept
