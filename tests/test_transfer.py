"""Staged host-to-device copies (toolkit/core/transfer.py), run on the CPU.

The CUDA copier pins its buffers, queues transfers without waiting and waits on events before it
refills a buffer. Here the same slicing runs with plain copies, and ``DeferredCopier`` stands in for
the asynchronous device: its transfers happen only when an event recorded behind them is waited on,
so a buffer refilled before its transfers ran would corrupt the copied bytes.
"""
from __future__ import annotations

import pytest
import torch

from toolkit.core.transfer import StagedCopier, copy_into, staged_copies


class _Event:
    def __init__(self, queued: list):
        self.queued = queued

    def synchronize(self) -> None:
        for target, stage in self.queued:
            target.copy_(stage)
        self.queued.clear()


class DeferredCopier(StagedCopier):
    """Transfers run late: when the event recorded behind them is waited on (as on a busy GPU)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.queued: list = []
        self.events = 0

    def _transfer(self, target, stage):
        self.queued.append((target, stage))

    def _record(self):
        self.events += 1
        event, self.queued = _Event(self.queued), []
        return event


def _tensors(sizes, dtype=torch.uint8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 255, (n,), generator=gen, dtype=torch.uint8).view(dtype) for n in sizes]


@pytest.mark.parametrize("copier_type", [StagedCopier, DeferredCopier])
def test_every_byte_arrives_across_buffer_boundaries(copier_type):
    # sizes below, at and above one 64-byte buffer, and above all buffers together
    sources = _tensors([1, 63, 64, 65, 10, 200, 64, 7, 129, 3])
    targets = [torch.zeros_like(s) for s in sources]
    copier = copier_type("cpu", slot_bytes=64, slots=2)
    for target, source in zip(targets, sources):
        copier.copy(target, source)
    copier.close()
    for target, source in zip(targets, sources):
        assert torch.equal(target, source)
    assert copier.staged_bytes == sum(s.numel() for s in sources)


def test_deferred_transfers_wait_for_their_buffer_before_it_is_refilled():
    sources = _tensors([40] * 12, seed=1)   # 480 bytes through 3 buffers of 64: each refilled twice
    targets = [torch.zeros_like(s) for s in sources]
    copier = DeferredCopier("cpu", slot_bytes=64, slots=3)
    for target, source in zip(targets, sources):
        copier.copy(target, source)
    copier.close()
    assert all(torch.equal(t, s) for t, s in zip(targets, sources))
    assert copier.events >= 480 // 64


def test_multi_byte_dtypes_and_shapes_are_copied_as_bytes():
    source = torch.randn(5, 7, dtype=torch.float32)
    target = torch.empty(5, 7, dtype=torch.float32)
    copier = DeferredCopier("cpu", slot_bytes=24, slots=2)
    copier.copy(target, source)
    copier.close()
    assert torch.equal(target, source)


def test_a_small_float_tensor_is_converted_on_the_host_as_copy_would():
    source = torch.randn(16, dtype=torch.float32)
    target = torch.empty(16, dtype=torch.bfloat16)
    copier = StagedCopier("cpu", slot_bytes=64, slots=2)
    assert copier.accepts(target, source)
    copier.copy(target, source)
    assert torch.equal(target, source.to(torch.bfloat16))


def test_what_is_not_staged_is_a_plain_copy():
    copier = StagedCopier("cpu", slot_bytes=64, slots=2)
    big = torch.randn(64, dtype=torch.float32)          # converted it would not fit one buffer
    assert not copier.accepts(torch.empty(64, dtype=torch.bfloat16), big)
    strided = torch.arange(20, dtype=torch.uint8)[::2]  # not contiguous
    assert not copier.accepts(torch.empty(10, dtype=torch.uint8), strided)
    assert not copier.accepts(torch.empty(2, 3), torch.ones(3))  # broadcast: copy_'s own rules
    target = torch.empty(10, dtype=torch.uint8)
    copier.copy(target, strided)
    broadcast = torch.empty(2, 3)
    copier.copy(broadcast, torch.arange(3.0))
    assert torch.equal(target, strided) and torch.equal(broadcast, torch.arange(3.0).expand(2, 3))
    assert copier.staged_bytes == 0


def test_outside_a_cuda_load_copy_into_is_copy():
    source, target = torch.arange(6.0), torch.empty(6)
    with staged_copies("cpu") as copier:
        assert copier is None
        copy_into(target, source)
    assert torch.equal(target, source)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_staged_copies_match_plain_copies():
    sources = _tensors([1, (16 << 20) - 3, 5, 40 << 20, 4096], seed=2)
    with staged_copies("cuda") as copier:
        targets = [torch.empty(s.shape, dtype=s.dtype, device="cuda") for s in sources]
        for target, source in zip(targets, sources):
            copy_into(target, source)
    assert copier.staged_bytes == sum(s.numel() for s in sources)
    assert all(torch.equal(t.cpu(), s) for t, s in zip(targets, sources))
