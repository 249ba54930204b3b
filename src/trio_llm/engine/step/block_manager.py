"""The KV block manager: which cache blocks each sequence owns, and the prefix cache.

What it owns: every block's reference count, the free queue, and the map from a full block's
chained hash to the block holding those tokens' K/V.

Invariants:
- A block is in `free` exactly when its reference count is 0. A free block may still hold a
  cached prefix (it keeps its hash until it is handed out again), so `free` doubles as the LRU
  eviction order: blocks are handed out from the front, freed blocks that hold a cached prefix go
  to the back (a sequence's last blocks first, so its leading blocks, the most shareable, are
  evicted last) and freed blocks with nothing cached go to the front.
- A cached block is matched by its whole chain, never by a hash alone: it keeps its tokens and
  the serial number of the block it follows in the chain, and a lookup compares both. A lookup
  walks a prompt block by block from the start, so a block is served only after every block
  before it was, and only if it follows exactly those; a hash collision (the hashes are 64-bit
  and not secret) can never serve another prompt's K/V.
- A block is published (made findable) once every position in it has its K/V, or, for a
  sequence admitted this step, once the step that computes them is scheduled: identical prompts
  admitted in the same step share their blocks, and the later ones attend to K/V the step
  writes before it attends. Should that step fail, the blocks it was to fill are unpublished.
- Two sequences that computed the same prefix each on their own keep one published copy; the
  other copy is never published and goes back to the front of the free queue.
- A sequence's chain starts at its `cache_root` instead of 0: a request with a `cache_salt`
  (vLLM's per-tenant isolation) or a LoRA adapter (`lora.adapter_root`) starts at a negative
  root, which never equals a block's serial, and a chain is matched from its root, so blocks of
  different roots (salts, adapters, or none) never match.
- A block is keyed by `Sequence.block_key`: its tokens, and for a block that holds an image's
  placeholder tokens that image's content digest too (engine/step/images.py), so two pictures
  behind the same placeholders never share a block.
- With an event sink (`events`), every publication and every unpublication is recorded as it
  happens, in order (`kv_events.py` sends them to an external router).
"""

from __future__ import annotations

import hashlib
import itertools
from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import Protocol

from trio_llm.engine.step.sequence import Sequence


class Block:
    __slots__ = ("block_id", "hash", "parent", "ref_count", "serial", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        """Set while the block is published (findable in the prefix cache)."""
        self.token_ids: tuple[object, ...] = ()
        """Its key (`Sequence.block_key`): the tokens, and any image's content."""
        self.serial = 0
        """Unique to this publication of the block (0 while unpublished)."""
        self.parent = 0
        """The serial of the block before it in its chain; 0 for a chain's first block."""


def chain_hash(parent: int, tokens: Seq[object]) -> int:
    """The lookup key of a block: its key (tokens, and an image's content where it holds
    placeholders: `Sequence.block_key`) and the key of the block before it."""
    return hash((parent, *tokens))


def salt_root(salt: str | None) -> int:
    """The root a salted request's chain starts from: negative (serials are positive, the
    unsalted root is 0) and the same in every process (not Python's randomized str hash)."""
    if salt is None:
        return 0
    digest = hashlib.sha256(salt.encode()).digest()
    return -1 - int.from_bytes(digest[:8], "little")


class BlockEvents(Protocol):
    """Where the block manager reports what the prefix cache gains and loses."""

    def stored(
        self,
        block_hash: int,
        parent_hash: int | None,
        token_ids: tuple[int, ...],
        adapter: tuple[int, str] | None = None,
        extra_keys: tuple[str, ...] | None = None,
    ) -> None:
        """A block became findable; `parent_hash` is the previous block's (None: the first);
        `adapter`: the LoRA adapter (load id, name) its K/V was computed with; `extra_keys`:
        what its hash holds beside the tokens (the content digests of the images whose
        placeholders it holds, hex)."""

    def removed(self, block_hash: int) -> None:
        """A block stopped being findable (evicted, or its step never completed)."""


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool,
        events: BlockEvents | None = None,
    ) -> None:
        self.events = events
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}
        self._serials = itertools.count(1)

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        return 1.0 - len(self.free) / len(self.blocks)

    # -- prefix cache ---------------------------------------------------------------------

    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[int]:
        """The chained hashes of the sequence's first `num_blocks` full blocks (memoized)."""
        hashes = seq.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else seq.cache_root
            hashes.append(chain_hash(parent, seq.block_key(i, bs)))
        return hashes

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Blocks already holding the longest cached prefix of the sequence's tokens.

        At least one token is always left to compute: its logits give the next token. A request
        that asks for prompt logprobs computes every prompt position, so it skips the lookup.
        """
        if not self.enable_prefix_caching or seq.wants_prompt_logprobs:
            return []
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[int] = []
        parent = seq.cache_root
        for i, h in enumerate(self.block_hashes(seq, max_blocks)):
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.parent != parent or block.token_ids != seq.block_key(i, bs):
                break
            hits.append(block_id)
            parent = block.serial
        return hits

    def cache_full_blocks(self, seq: Sequence, num_tokens: int | None = None) -> None:
        """Publish the sequence's blocks that are full once its first `num_tokens` tokens
        (default: those computed) have their K/V."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = (seq.num_computed_tokens if num_tokens is None else num_tokens) // bs
        chain = seq.block_chain
        if len(chain) >= num_full or (chain and chain[-1] == 0):
            return  # published already, or the chain broke at a hash collision
        hashes = self.block_hashes(seq, num_full)
        for i in range(len(chain), num_full):
            parent = chain[-1] if chain else seq.cache_root
            tokens = seq.block_key(i, bs)
            held = self.hash_to_block.get(hashes[i])
            if held is not None:
                other = self.blocks[held]
                if other.parent == parent and other.token_ids == tokens:
                    chain.append(other.serial)  # the same prefix is published already
                    continue
                chain.append(0)  # a collision: this chain stays unpublished from here
                return
            block = self.blocks[seq.block_table[i]]
            block.hash, block.token_ids, block.parent = hashes[i], tokens, parent
            block.serial = next(self._serials)
            self.hash_to_block[block.hash] = block.block_id
            chain.append(block.serial)
            if self.events is not None:
                # Its tokens apart from the images' keys, which travel as vLLM's extra_keys
                # (the digests only: a router keys a block by the images it holds).
                plain = tuple(seq.token_ids[i * bs : (i + 1) * bs]) if seq.images else tokens
                extra = tuple(dict.fromkeys(d.hex() for d, _ in tokens[len(plain) :]))  # type: ignore[misc]
                self.events.stored(
                    block.hash,
                    hashes[i - 1] if i else None,
                    plain,  # type: ignore[arg-type]
                    seq.adapter,
                    extra or None,
                )

    def _unpublish(self, block: Block) -> None:
        if block.hash is not None and self.hash_to_block.get(block.hash) == block.block_id:
            del self.hash_to_block[block.hash]
            if self.events is not None:
                self.events.removed(block.hash)
        block.hash, block.token_ids, block.parent, block.serial = None, (), 0, 0

    # -- allocation -----------------------------------------------------------------------

    def _blocks_needed(self, seq: Sequence, num_new_tokens: int, num_cached: int) -> int:
        total = seq.num_computed_tokens + num_cached * self.block_size + num_new_tokens
        return max(0, -(-total // self.block_size) - len(seq.block_table) - num_cached)

    def can_allocate(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> bool:
        """Can the sequence reuse `cached` and get blocks for `num_new_tokens` more tokens?"""
        revived = sum(1 for b in cached if self.blocks[b].ref_count == 0)
        return self._blocks_needed(seq, num_new_tokens, len(cached)) + revived <= len(self.free)

    def allocate(self, seq: Sequence, num_new_tokens: int, cached: Seq[int] = ()) -> None:
        """Give the sequence the cached prefix blocks and room for `num_new_tokens` more."""
        needed = self._blocks_needed(seq, num_new_tokens, len(cached))
        for block_id in cached:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self.free[block_id]
            block.ref_count += 1
        seq.block_table.extend(cached)
        seq.block_chain.extend(self.blocks[b].serial for b in cached)
        seq.num_computed_tokens += len(cached) * self.block_size
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict the cached prefix it held
            self._unpublish(block)
        block.ref_count = 1
        return block_id

    def deallocate(self, seq: Sequence) -> None:
        computed = seq.num_computed_tokens // self.block_size
        for i in range(len(seq.block_table) - 1, -1, -1):
            block = self.blocks[seq.block_table[i]]
            if i >= computed and block.hash is not None:
                # Published for a step that never completed: its K/V were never written.
                self._unpublish(block)
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block.block_id] = None
                if block.hash is None:
                    self.free.move_to_end(block.block_id, last=False)
        seq.block_table.clear()
        seq.block_chain.clear()
        seq.num_computed_tokens = 0
