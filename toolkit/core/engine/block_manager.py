"""Paged KV-cache blocks: allocation with ref counts, and automatic prefix caching.

A block is a fixed run of ``block_size`` token slots in every layer's cache. When a block
fills with computed tokens it gets a hash chained from the previous block's hash and its own
token ids, so a later request whose prompt starts with the same tokens reuses the block
instead of recomputing it. Blocks whose ref count drops to zero stay hashed in the free queue
(least recently freed first out) and are only evicted when a new block is needed.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from .sequence import Sequence


@dataclass
class PrefixCacheStats:
    """Prompt tokens looked up in the prefix cache, and how many were found there."""

    queried_tokens: int = 0
    hit_tokens: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


def chain_hash(parent: int | None, token_ids: tuple[int, ...]) -> int:
    """Hash of a full block given the hash of the block before it (None for the first)."""
    return hash((parent, token_ids))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block (got {num_blocks})")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks
        self.hash_to_block: dict[int, int] = {}
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.stats = PrefixCacheStats()

    # ---- accounting -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence holds (some may still serve as cached prefixes until evicted)."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    # ---- prefix cache -----------------------------------------------------------------------
    def block_hashes(self, seq: Sequence, num_full_blocks: int) -> list[int]:
        """Chained hashes of (at least) the sequence's first full blocks, cached on the sequence."""
        hashes = seq.block_hashes
        while len(hashes) < num_full_blocks:
            parent = hashes[-1] if hashes else None
            hashes.append(chain_hash(parent, tuple(seq.block_tokens(len(hashes)))))
        return hashes

    def lookup_prefix(self, seq: Sequence) -> list[int]:
        """Cached blocks holding the longest prefix of ``seq`` (at least one token is left to compute)."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        num_full = (len(seq) - 1) // self.block_size
        for index, block_hash in enumerate(self.block_hashes(seq, num_full)[:num_full]):
            block_id = self.hash_to_block.get(block_hash)
            if block_id is None or self.block_tokens[block_id] != tuple(seq.block_tokens(index)):
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, seq: Sequence, num_new_tokens: int, prefix_hits: list[int] = ()) -> bool:
        """Whether taking ``prefix_hits`` and slots for ``num_new_tokens`` more tokens would fit now."""
        return self._blocks_to_take(seq, num_new_tokens, prefix_hits) <= len(self.free_queue)

    def _blocks_to_take(self, seq: Sequence, num_new_tokens: int, prefix_hits) -> int:
        held = len(seq.block_table) + len(prefix_hits)
        computed = seq.num_computed_tokens + len(prefix_hits) * self.block_size
        new_blocks = max(0, seq.blocks_needed(computed + num_new_tokens) - held)
        return new_blocks + sum(1 for block_id in prefix_hits if self.ref_count[block_id] == 0)

    def take_prefix(self, seq: Sequence, prefix_hits: list[int]) -> None:
        """Give a new sequence the cached blocks of its prefix; those tokens count as computed."""
        assert not seq.block_table and seq.num_computed_tokens == 0, "prefix is taken once, before any compute"
        self.stats.queried_tokens += len(seq) - 1 if self.enable_prefix_caching else 0
        self.stats.hit_tokens += len(prefix_hits) * self.block_size
        for block_id in prefix_hits:
            self._ref(block_id)
        seq.block_table = list(prefix_hits)
        seq.num_computed_tokens = seq.num_cached_tokens = len(prefix_hits) * self.block_size
        seq.num_committed_blocks = len(prefix_hits)

    # ---- allocation -------------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``num_new_tokens`` more tokens; all or nothing."""
        needed = seq.blocks_needed(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if needed > len(self.free_queue):
            return False
        for _ in range(max(0, needed)):
            seq.block_table.append(self._take_free_block())
        return True

    def commit_computed(self, seq: Sequence) -> None:
        """Hash the blocks that are now full of computed tokens, so later requests can reuse them."""
        if not self.enable_prefix_caching:
            return
        num_full = seq.num_full_blocks(seq.num_computed_tokens)
        if num_full <= seq.num_committed_blocks:
            return
        hashes = self.block_hashes(seq, num_full)
        for index in range(seq.num_committed_blocks, num_full):
            block_id, block_hash = seq.block_table[index], hashes[index]
            if self.block_hash[block_id] is None and block_hash not in self.hash_to_block:
                self.block_hash[block_id] = block_hash
                self.block_tokens[block_id] = tuple(seq.block_tokens(index))
                self.hash_to_block[block_hash] = block_id
        seq.num_committed_blocks = num_full

    def free(self, seq: Sequence) -> None:
        """Drop the sequence's hold on its blocks; the tail goes first into the eviction order."""
        for block_id in reversed(seq.block_table):
            self.ref_count[block_id] -= 1
            if self.ref_count[block_id] == 0:
                self.free_queue[block_id] = None
        seq.block_table = []

    # ---- internals --------------------------------------------------------------------------
    def _ref(self, block_id: int) -> None:
        if self.ref_count[block_id] == 0:
            del self.free_queue[block_id]
        self.ref_count[block_id] += 1

    def _take_free_block(self) -> int:
        block_id, _ = self.free_queue.popitem(last=False)
        if self.block_hash[block_id] is not None:  # evict the cached prefix it still held
            del self.hash_to_block[self.block_hash[block_id]]
            self.block_hash[block_id] = self.block_tokens[block_id] = None
        self.ref_count[block_id] = 1
        return block_id

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks held by running sequences keep their contents)."""
        for block_hash, block_id in list(self.hash_to_block.items()):
            self.block_hash[block_id] = self.block_tokens[block_id] = None
            del self.hash_to_block[block_hash]
