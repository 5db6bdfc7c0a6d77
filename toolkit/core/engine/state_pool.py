"""Fixed-size recurrent state per request (for hybrid attention/recurrent models).

A recurrent layer (Mamba, linear attention...) keeps one state of constant size per
sequence instead of a KV cache that grows with its length, so it needs a slot, not blocks.
The pool preallocates ``num_slots`` states for every registered tensor and hands out slot
indices in O(1); it is sized independently of the attention blocks. A model reads and writes
``pool.tensors[name][slot]`` for the sequences of a batch (``slots_for`` gives the index tensor).
"""
from __future__ import annotations

import torch

from ..errors import ToolkitError


class StatePoolExhaustedError(ToolkitError):
    """Every slot is taken; the scheduler checks ``num_free_slots`` before admitting a request."""


class StatePool:
    """Slots of recurrent state: ``tensors[name]`` has shape [num_slots, *state_shape]."""

    def __init__(self, num_slots: int, state_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
                 device: torch.device | str = "cpu"):
        if num_slots < 1:
            raise ValueError(f"a state pool needs at least one slot (got {num_slots})")
        self.num_slots = num_slots
        self.tensors = {name: torch.zeros((num_slots, *shape), dtype=dtype, device=device)
                        for name, (shape, dtype) in state_shapes.items()}
        self._free = list(range(num_slots - 1, -1, -1))  # a stack: pop() hands out slot 0 first
        self._slot_of: dict[str, int] = {}

    @classmethod
    def sized_by_memory(cls, memory_bytes: int, state_shapes: dict[str, tuple[tuple[int, ...], torch.dtype]],
                        device: torch.device | str = "cpu", max_slots: int | None = None) -> "StatePool":
        """As many slots as fit in ``memory_bytes`` (capped at ``max_slots``)."""
        per_slot = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
                       for shape, dtype in state_shapes.values())
        num_slots = memory_bytes // max(per_slot, 1)
        return cls(min(num_slots, max_slots) if max_slots else num_slots, state_shapes, device)

    @property
    def num_free_slots(self) -> int:
        return len(self._free)

    def allocate(self, request_id: str) -> int:
        """A zeroed slot for a new (or recomputed) request; O(1) apart from the zeroing."""
        if request_id in self._slot_of:
            raise ValueError(f"request {request_id!r} already holds state slot {self._slot_of[request_id]}")
        if not self._free:
            raise StatePoolExhaustedError(f"all {self.num_slots} recurrent-state slots are in use")
        slot = self._free.pop()
        self._slot_of[request_id] = slot
        for tensor in self.tensors.values():
            tensor[slot].zero_()  # a recurrent state must start from zero, never from a previous owner
        return slot

    def free(self, request_id: str) -> None:
        """Return the request's slot (no-op if it holds none, e.g. it never started)."""
        slot = self._slot_of.pop(request_id, None)
        if slot is not None:
            self._free.append(slot)

    def slot_of(self, request_id: str) -> int:
        return self._slot_of[request_id]

    def slots_for(self, request_ids: list[str], device: torch.device | str | None = None) -> torch.Tensor:
        """Slot indices of a batch's requests, in order, as an int64 tensor."""
        if device is None:
            device = next(iter(self.tensors.values())).device if self.tensors else "cpu"
        return torch.tensor([self._slot_of[r] for r in request_ids], dtype=torch.long, device=device)
