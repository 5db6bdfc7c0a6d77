"""Recurrent-state slots: O(1) hand-out, zeroed on reuse, exhaustion is a clear error."""
from __future__ import annotations

import pytest
import torch

from toolkit.core.engine.state_pool import StatePool, StatePoolExhaustedError

SHAPES = {"conv": ((3, 4), torch.float32), "ssm": ((2, 2), torch.float16)}


def test_slots_are_distinct_and_returned():
    pool = StatePool(3, SHAPES)
    slots = [pool.allocate(r) for r in ("a", "b", "c")]
    assert sorted(slots) == [0, 1, 2] and pool.num_free_slots == 0
    with pytest.raises(StatePoolExhaustedError, match="all 3"):
        pool.allocate("d")
    pool.free("b")
    assert pool.num_free_slots == 1 and pool.allocate("d") == slots[1]
    assert pool.slots_for(["d", "a"]).tolist() == [slots[1], slots[0]]


def test_reused_slot_starts_from_zero():
    pool = StatePool(1, SHAPES)
    slot = pool.allocate("a")
    pool.tensors["conv"][slot].fill_(7)
    pool.tensors["ssm"][slot].fill_(3)
    pool.free("a")
    slot = pool.allocate("b")
    assert pool.tensors["conv"][slot].abs().sum() == 0 and pool.tensors["ssm"][slot].abs().sum() == 0


def test_freeing_unknown_request_is_harmless_and_double_allocation_is_refused():
    pool = StatePool(2, SHAPES)
    pool.free("never")
    pool.allocate("a")
    with pytest.raises(ValueError, match="already holds"):
        pool.allocate("a")


def test_sized_by_memory_independently_of_kv_blocks():
    per_slot = 3 * 4 * 4 + 2 * 2 * 2
    pool = StatePool.sized_by_memory(per_slot * 5 + 1, SHAPES)
    assert pool.num_slots == 5 and pool.tensors["conv"].shape == (5, 3, 4)
    assert StatePool.sized_by_memory(per_slot * 5, SHAPES, max_slots=2).num_slots == 2


def test_slots_are_recycled_at_scale():
    pool = StatePool(1000, {"s": ((1,), torch.float32)})
    for i in range(1000):
        pool.allocate(str(i))
    for i in range(0, 1000, 2):
        pool.free(str(i))
    assert pool.num_free_slots == 500 and len({pool.allocate(f"n{i}") for i in range(500)}) == 500
