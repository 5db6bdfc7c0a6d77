"""Paged KV blocks: ref counts, all-or-nothing allocation, hash-chained prefix reuse, eviction."""
from __future__ import annotations

from toolkit.core.engine.block_manager import BlockManager
from toolkit.core.engine.sampling_params import SamplingParams
from toolkit.core.engine.sequence import Sequence

BS = 4


def seq(tokens, request_id="r"):
    return Sequence(request_id, list(tokens), SamplingParams(), BS)


def run_prefill(bm: BlockManager, s: Sequence) -> None:
    """Admit ``s`` as the scheduler does, compute its whole prompt, commit its blocks."""
    hits = bm.lookup_prefix(s)
    bm.take_prefix(s, hits)
    assert bm.allocate_slots(s, len(s) - s.num_computed_tokens)
    s.num_computed_tokens = len(s)
    bm.commit_computed(s)


def test_allocation_is_all_or_nothing_and_free_returns_every_block():
    bm = BlockManager(num_blocks=5, block_size=BS)
    a, b = seq(range(10), "a"), seq(range(100, 110), "b")
    assert bm.allocate_slots(a, 10) and len(a.block_table) == 3
    assert not bm.allocate_slots(b, 10)          # needs 3, only 2 free
    assert b.block_table == [] and bm.num_free_blocks == 2
    assert bm.allocate_slots(b, 8) and len(b.block_table) == 2
    assert len(set(a.block_table) | set(b.block_table)) == 5
    bm.free(a)
    bm.free(b)
    assert bm.num_free_blocks == 5 and bm.ref_count == [0] * 5


def test_growing_a_sequence_adds_a_block_only_at_a_boundary():
    bm = BlockManager(num_blocks=4, block_size=BS)
    s = seq(range(3))
    bm.allocate_slots(s, 3)
    s.num_computed_tokens = 3
    assert bm.allocate_slots(s, 1) and len(s.block_table) == 1   # 4th token fits the first block
    s.num_computed_tokens = 4
    assert bm.allocate_slots(s, 1) and len(s.block_table) == 2


def test_shared_prefix_is_reused_with_ref_counts():
    bm = BlockManager(num_blocks=10, block_size=BS)
    first = seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "first")
    run_prefill(bm, first)
    second = seq([1, 2, 3, 4, 5, 6, 7, 8, 42, 43], "second")
    hits = bm.lookup_prefix(second)
    assert hits == first.block_table[:2]
    run_prefill(bm, second)
    assert second.num_cached_tokens == 8 and second.block_table[:2] == first.block_table[:2]
    assert [bm.ref_count[b] for b in first.block_table[:2]] == [2, 2]
    assert bm.stats.hit_tokens == 8
    bm.free(first)
    assert [bm.ref_count[b] for b in second.block_table[:2]] == [1, 1]


def test_different_earlier_block_breaks_the_chain():
    bm = BlockManager(num_blocks=10, block_size=BS)
    run_prefill(bm, seq([1, 2, 3, 4, 5, 6, 7, 8, 9], "a"))
    # same second block, different first block: the hash chain must not match block 2 alone
    assert bm.lookup_prefix(seq([0, 2, 3, 4, 5, 6, 7, 8, 9], "b")) == []


def test_last_token_is_always_left_to_compute():
    bm = BlockManager(num_blocks=10, block_size=BS)
    run_prefill(bm, seq(range(8), "a"))
    assert len(bm.lookup_prefix(seq(range(8), "b"))) == 1  # 8 tokens cached, but one must run for logits


def test_freed_blocks_stay_cached_until_evicted():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq(range(9), "a")
    run_prefill(bm, a)
    bm.free(a)
    assert bm.num_free_blocks == 3
    assert len(bm.lookup_prefix(seq(range(9), "again"))) == 2   # still cached after free
    filler = seq(range(100, 112), "filler")
    assert bm.allocate_slots(filler, 12)                          # takes every block: evicts all
    assert bm.lookup_prefix(seq(range(9), "later")) == [] and bm.hash_to_block == {}


def test_taking_a_cached_free_block_counts_against_free_blocks():
    bm = BlockManager(num_blocks=3, block_size=BS)
    a = seq(range(9), "a")
    run_prefill(bm, a)
    bm.free(a)
    b = seq(list(range(8)) + [50, 51, 52, 53, 54], "b")  # 2 cached blocks + needs 2 more = 4 > 3
    hits = bm.lookup_prefix(b)
    assert len(hits) == 2 and not bm.can_allocate(b, len(b) - 8, hits)
    c = seq(list(range(8)) + [60], "c")                   # 2 cached + 1 new = 3
    assert bm.can_allocate(c, 1, bm.lookup_prefix(c))


def test_prefix_caching_off_never_hits():
    bm = BlockManager(num_blocks=10, block_size=BS, enable_prefix_caching=False)
    run_prefill(bm, seq(range(9), "a"))
    assert bm.lookup_prefix(seq(range(9), "b")) == [] and bm.hash_to_block == {}
