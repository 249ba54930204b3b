"""The KV block manager: which cache blocks each sequence owns, and the prefix cache.

What it owns: every block's reference count, the free queue, and the map from a full block's
chained hash to the block holding those tokens' K/V.

Invariants:
- A block is in `free` exactly when its reference count is 0. A free block may still hold a
  cached prefix (it keeps its hash until it is handed out again), so `free` doubles as the LRU
  eviction order: blocks are handed out from the front, freed blocks that hold a cached prefix go
  to the back (a sequence's last blocks first, so its leading blocks, the most shareable, are
  evicted last) and freed blocks with nothing cached go to the front.
- A block's hash is the hash of (previous block's hash, its tokens), so equal hashes mean equal
  prefixes; the block also keeps its tokens, and a lookup compares them, so a hash collision
  can never serve another prompt's K/V.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq

from trio_llm.engine.sequence import Sequence


class Block:
    __slots__ = ("block_id", "hash", "ref_count", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_count = 0
        self.hash: int | None = None
        self.token_ids: tuple[int, ...] = ()


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.hash_to_block: dict[int, int] = {}

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
        tokens = seq.token_ids
        while len(hashes) < num_blocks:
            i = len(hashes)
            hashes.append(hash((hashes[-1] if hashes else 0, *tokens[i * bs : (i + 1) * bs])))
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
        for i, h in enumerate(self.block_hashes(seq, max_blocks)):
            block_id = self.hash_to_block.get(h)
            if block_id is None:
                break
            block = self.blocks[block_id]
            if block.token_ids != tuple(seq.token_ids[i * bs : (i + 1) * bs]):
                break
            hits.append(block_id)
        return hits

    def cache_full_blocks(self, seq: Sequence) -> None:
        """Publish the blocks whose every position now has its K/V computed."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        num_full = seq.num_computed_tokens // bs
        hashes = self.block_hashes(seq, num_full)
        for i in range(num_full - 1, -1, -1):
            block = self.blocks[seq.block_table[i]]
            if block.hash is not None:
                break  # this block and every earlier one are already published
            h = hashes[i]
            block.hash = h
            block.token_ids = tuple(seq.token_ids[i * bs : (i + 1) * bs])
            self.hash_to_block.setdefault(h, block.block_id)

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
        seq.num_computed_tokens += len(cached) * self.block_size
        for _ in range(needed):
            seq.block_table.append(self._take_free_block())

    def _take_free_block(self) -> int:
        block_id, _ = self.free.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:  # evict the cached prefix it held
            if self.hash_to_block.get(block.hash) == block_id:
                del self.hash_to_block[block.hash]
            block.hash = None
            block.token_ids = ()
        block.ref_count = 1
        return block_id

    def deallocate(self, seq: Sequence) -> None:
        for block_id in reversed(seq.block_table):
            block = self.blocks[block_id]
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free[block_id] = None
                if block.hash is None:
                    self.free.move_to_end(block_id, last=False)
        seq.block_table.clear()
        seq.num_computed_tokens = 0
