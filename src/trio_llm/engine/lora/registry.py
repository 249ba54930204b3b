"""The engine's loaded adapters: each one's name, slot in the stacks, and prefix-cache root.

A request names its adapter; the registry gives its slot (which rows of a step get which
update) and a cache root. Every load gets a new load number, and a sequence's chain of block
hashes starts at a root made from it (`adapter_root`), so blocks computed with one adapter are
never served to a request of another, nor of the base model, nor of the same name loaded again
from other weights.

Unloading takes the name away at once (new requests for it are refused), but the slot keeps
its weights while sequences still use it: they finish on the adapter they started with. The
slot is reused only once no live sequence holds it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from trio_llm.engine.lora.adapter import LoraLoadError, read_adapter
from trio_llm.engine.lora.stacks import LoraStacks


class LoraNotFoundError(LookupError):
    """No adapter of that name is loaded."""


@dataclass(frozen=True, slots=True)
class LoadedAdapter:
    name: str
    path: str
    slot: int
    load_id: int
    rank: int


def adapter_root(load_id: int, root: int = 0) -> int:
    """Where the block-hash chain of a sequence on the adapter of load `load_id` starts, given
    the root it would have without the adapter (0, or a cache salt's, which lies in
    [-2**64, 0]): below -2**65, so it is never a serial (positive), the base's root (0) nor a
    salt's; and distinct for every (load, root), so adapters and salts never share a block."""
    return -(load_id << 65) - 1 + root


class LoraRegistry:
    def __init__(self, stacks: LoraStacks) -> None:
        self.stacks = stacks
        self._loaded: dict[str, LoadedAdapter] = {}
        self._draining: set[int] = set()
        """Slots of unloaded adapters that live sequences may still use."""
        self._load_ids = itertools.count(1)

    def names(self) -> list[str]:
        return list(self._loaded)

    def names_of(self, slots: Iterable[int]) -> list[str]:
        """The loaded adapters in `slots`, each once, in the order first met (the base, -1,
        and unloaded adapters still finishing have no name)."""
        by_slot = {a.slot: a.name for a in self._loaded.values()}
        return list(dict.fromkeys(by_slot[s] for s in slots if s in by_slot))

    def lookup(self, name: str) -> LoadedAdapter:
        adapter = self._loaded.get(name)
        if adapter is None:
            raise LoraNotFoundError(f"the LoRA adapter {name!r} is not loaded")
        return adapter

    def load(self, name: str, path: str, in_use: Iterable[int] = ()) -> LoadedAdapter:
        """Read and check the adapter at `path`, put it in a free slot and serve it as `name`;
        `in_use`: the slots of the live sequences (a drained slot is free again).
        `LoraLoadError` with the reason when it cannot be served."""
        if name in self._loaded:
            raise LoraLoadError(f"a LoRA adapter named {name!r} is loaded already")
        if not Path(path).is_dir():
            raise LoraLoadError(f"{path}: no such adapter directory")
        slot = self._free_slot(set(in_use))
        stacks = self.stacks
        adapter = read_adapter(
            path,
            stacks.modules,
            max_rank=stacks.max_rank,
            dtype=stacks.dtype,
            device=stacks.device,
        )
        stacks.write(slot, adapter)
        loaded = LoadedAdapter(name, str(path), slot, next(self._load_ids), adapter.rank)
        self._loaded[name] = loaded
        return loaded

    def unload(self, name: str) -> None:
        """Stop serving `name`; the sequences already on it finish on it."""
        adapter = self._loaded.pop(name, None)
        if adapter is None:
            raise LoraNotFoundError(f"the LoRA adapter {name!r} is not loaded")
        self._draining.add(adapter.slot)

    def _free_slot(self, in_use: set[int]) -> int:
        self._draining &= in_use
        taken = {a.slot for a in self._loaded.values()} | self._draining
        for slot in range(self.stacks.max_loras):
            if slot not in taken:
                return slot
        finishing = f" ({len(self._draining)} unloaded, still finishing requests)" * bool(
            self._draining
        )
        raise LoraLoadError(
            f"{self.stacks.max_loras} LoRA adapters are loaded{finishing}, the engine's bound "
            "(--max-loras); unload one first"
        )
