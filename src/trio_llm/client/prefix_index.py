"""Which replica holds which prompt prefix, as the router remembers it: cache-aware routing.

Several replicas of a model each keep their own prefix cache, so a multi-turn chat whose turns
land on different replicas recomputes its whole history every turn. The router cannot ask the
engines what they hold without a round trip per request, so it remembers what it sent where
(SGLang's cache-aware router does the same with a radix tree of prompt text): each replica's
record is the chained hashes of the full token blocks of the prompts routed to it, least
recently used evicted first, bounded by that replica's KV cache in blocks. A prompt's match on
a replica is the number of its leading blocks in that replica's record.

The choice (`PrefixPolicy.choose`), with SGLang's rule: when the replicas' loads are
imbalanced (the most loaded exceeds the least by more than `balance_abs_threshold` sequences
and by more than `balance_rel_threshold` times), the least loaded wins, whatever it holds;
otherwise the replica with the longest match wins if it matches more than `cache_threshold` of
the prompt's blocks, and the least loaded otherwise.

Invariants:
- A record only approximates the engine's cache (the engine evicts under its own pressure, and
  a replica that died lost everything: `forget`), so a wrong guess costs a recomputation, never
  a wrong answer: routing never changes what a request computes.
- Hashes are chained (block i's key covers blocks 0..i) and start from the request's cache
  salt, so a match is a match of the whole prefix, and salted prompts match only their salt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


def block_keys(token_ids: Sequence[int], block_size: int, salt: str | None = None) -> list[int]:
    """The chained keys of the prompt's full blocks (a last partial block is never cached)."""
    keys: list[int] = []
    parent = 0 if salt is None else hash(("salt", salt))
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start : start + block_size]))
        keys.append(parent)
    return keys


class PrefixRecord:
    """One replica's remembered blocks, least recently used first."""

    __slots__ = ("_keys", "capacity")

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._keys: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def match(self, keys: Sequence[int]) -> int:
        """How many of `keys`, from the first, this replica holds."""
        held = 0
        for key in keys:
            if key not in self._keys:
                break
            held += 1
        return held

    def insert(self, keys: Sequence[int]) -> None:
        """Record `keys` as just used; evict the least recently used past the capacity."""
        for key in keys:
            self._keys[key] = None
            self._keys.move_to_end(key)
        while len(self._keys) > self.capacity:
            self._keys.popitem(last=False)

    def clear(self) -> None:
        self._keys.clear()


@dataclass(frozen=True, slots=True)
class PrefixPolicy:
    """When a held prefix outweighs load (SGLang's router defaults)."""

    cache_threshold: float = 0.5
    """A replica is preferred for its prefix only when it holds more than this share of the
    prompt's blocks."""
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    enabled: bool = True
    """False: always the least loaded (the figure `bench/scale_out/scale.py` compares against)."""

    def imbalanced(self, loads: Sequence[int]) -> bool:
        most, least = max(loads), min(loads)
        return (
            most - least > self.balance_abs_threshold and most > self.balance_rel_threshold * least
        )

    def choose(self, loads: Sequence[int], matches: Sequence[int], num_keys: int) -> int | None:
        """The index (into `loads`) of the replica whose prefix wins, or None: the least loaded
        should take the request."""
        if not self.enabled or not num_keys or len(loads) < 2 or self.imbalanced(loads):
            return None
        best = max(range(len(matches)), key=lambda i: (matches[i], -loads[i]))
        if matches[best] / num_keys > self.cache_threshold:
            return best
        return None
