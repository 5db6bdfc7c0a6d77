"""Host-to-device copies of checkpoint bytes during a load, through a ring of pinned host buffers.

Parameters copy the tensors a checkpoint yields (often views of a memory-mapped file) into their
device storage with ``copy_into(dst, src)``. Outside ``staged_copies`` that is ``dst.copy_(src)``.
Inside ``staged_copies(device)`` on a CUDA device it goes through a ``StagedCopier``:

* A copy from pageable memory (a memory map) is synchronous: the host waits while the driver copies
  through its own staging memory, so reading the file and the transfer take turns.
* The copier copies each tensor on the host into one of a few pinned buffers (torch's CPU copy,
  which uses several threads) and queues the transfer from there without waiting
  (``non_blocking``); the transfer of one buffer then overlaps the host filling the next.
* A buffer is refilled only after the transfers queued from it have finished (an event recorded
  behind them), and leaving ``staged_copies`` waits for every transfer, so the load's next phase
  sees complete weights and the source may be unmapped once ``copy_into`` returns.

Every other copy (CPU to CPU, a device source, another dtype or shape, non-contiguous tensors)
stays ``dst.copy_(src)``. ``TOOLKIT_STAGED_COPIES=0`` turns the staging off (plain copies), to
compare the two on a GPU.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Iterator

import torch

SLOT_BYTES = 16 << 20  # each pinned buffer: large enough that a transfer is not dominated by its launch
SLOTS = 2              # one filled by the host while the other's transfer runs

_active: contextvars.ContextVar["StagedCopier | None"] = contextvars.ContextVar("toolkit_staged_copier",
                                                                                 default=None)


class StagedCopier:
    """Copies contiguous host tensors into contiguous device tensors of the same dtype and shape
    through ``slots`` host buffers of ``slot_bytes`` each, filled in turn.

    :param device: the destination device; on CUDA the buffers are pinned and each buffer's last
        transfer is followed by an event. Any other device gets unpinned buffers and no events,
        which exercises the same slicing with plain copies (tests run it on the CPU).
    """

    def __init__(self, device: torch.device | str, *, slot_bytes: int = SLOT_BYTES, slots: int = SLOTS):
        if slot_bytes <= 0 or slots <= 0:
            raise ValueError(f"slot_bytes and slots must be positive, got {slot_bytes} and {slots}")
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        if self.is_cuda and self.device.index is None:  # "cuda" is the current device; tensors name its index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.slot_bytes = slot_bytes
        self._buffers = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=self.is_cuda) for _ in range(slots)]
        self._events: list = [None] * slots  # the event behind each buffer's last queued transfer
        self._slot, self._used = 0, 0        # the buffer being filled, and how many of its bytes are taken
        self.staged_bytes = 0                # bytes that went through the buffers (what tests and benches read)

    def accepts(self, dst: torch.Tensor, src: torch.Tensor) -> bool:
        """Whether ``copy`` stages this pair (else it is a plain ``dst.copy_(src)``): a contiguous host
        tensor into a contiguous one on the device, of one dtype, or of two float dtypes when the
        converted tensor fits one buffer (a norm's float32 values into bfloat16 weights)."""
        if not (src.device.type == "cpu" and dst.device == self.device and dst.shape == src.shape
                and dst.is_contiguous() and src.is_contiguous() and src.numel() > 0):
            return False
        return dst.dtype == src.dtype or (dst.is_floating_point() and src.is_floating_point()
                                          and dst.numel() * dst.element_size() <= self.slot_bytes)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``, staged when ``accepts``. The copy into ``dst`` may still be running when
        this returns (``close`` waits); ``src`` is no longer read."""
        if not self.accepts(dst, src):
            dst.copy_(src)
            return
        if src.dtype != dst.dtype:  # small: converted on the host, as the device would (round to nearest even)
            src = src.to(dst.dtype)
        source, target = src.reshape(-1).view(torch.uint8), dst.view(-1).view(torch.uint8)
        total, done = source.numel(), 0
        while done < total:
            if self._used == self.slot_bytes:
                self._next_slot()
            size = min(self.slot_bytes - self._used, total - done)
            stage = self._buffers[self._slot].narrow(0, self._used, size)
            stage.copy_(source.narrow(0, done, size))
            self._transfer(target.narrow(0, done, size), stage)
            self._used += size
            done += size
        self.staged_bytes += total

    def _transfer(self, target: torch.Tensor, stage: torch.Tensor) -> None:
        """Queue the copy of a filled part of a buffer to the device (on CUDA without waiting for it)."""
        target.copy_(stage, non_blocking=self.is_cuda)

    def _next_slot(self) -> None:
        """Close the current buffer behind an event and move to the next, waiting for its transfers."""
        self._events[self._slot] = self._record()
        self._slot = (self._slot + 1) % len(self._buffers)
        event, self._events[self._slot] = self._events[self._slot], None
        if event is not None:
            event.synchronize()
        self._used = 0

    def _record(self):
        """An event behind the transfers queued so far (None where copies are synchronous)."""
        if not self.is_cuda:
            return None
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        return event

    def close(self) -> None:
        """Wait for every queued transfer, then let the buffers go."""
        if self._used:
            self._events[self._slot] = self._record()
        for event in self._events:
            if event is not None:
                event.synchronize()
        self._events = [None] * len(self._buffers)
        self._buffers, self._used = [], 0


@contextlib.contextmanager
def staged_copies(device: torch.device | str) -> Iterator[StagedCopier | None]:
    """``copy_into`` stages host-to-device copies inside this block when ``device`` is a CUDA device
    (yields the copier, else None); on leaving, even on an error, every transfer has finished."""
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TOOLKIT_STAGED_COPIES") == "0":
        yield None
        return
    copier = StagedCopier(device)
    token = _active.set(copier)
    try:
        yield copier
    finally:
        _active.reset(token)
        copier.close()


def copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst.copy_(src)``, through the active ``staged_copies`` block's copier if there is one."""
    copier = _active.get()
    if copier is None:
        dst.copy_(src)
    else:
        copier.copy(dst, src)
