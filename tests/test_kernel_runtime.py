"""The kernel runtime's resolution cache: ``supports`` runs once per (op, call signature), and
``register``, ``reset`` and ``invalidate`` forget what was cached."""
from __future__ import annotations

import pytest
import torch

from toolkit.core.errors import UnknownNameError
from toolkit.kernels import runtime

OP = "test_runtime_cache_op"


@pytest.fixture
def private_runtime(monkeypatch):
    """Registrations and caches that end with the test (the real registry is loaded first)."""
    runtime.candidates("rms_norm", "cpu")
    monkeypatch.setattr(runtime, "_OPS", {name: list(impls) for name, impls in runtime._OPS.items()})
    monkeypatch.setattr(runtime, "_CANDIDATES", {})
    monkeypatch.setattr(runtime, "_RESOLVED", {})
    return runtime


def counted(name: str, accept=lambda *args, **kwargs: True):
    """An implementation returning ``name``, whose ``supports`` counts its calls."""
    def impl(*args, **kwargs):
        return name

    def supports(*args, **kwargs):
        impl.asked += 1
        return accept(*args, **kwargs)

    impl.asked, impl.supports = 0, supports
    return impl


def test_supports_runs_once_per_signature(private_runtime):
    fast = counted("fast", accept=lambda x, *rest, **kw: x.dtype == torch.float32 and x.shape[-1] % 4 == 0)
    private_runtime.register(OP, lambda *args: "reference")
    private_runtime.register(OP, fast, device="cpu", priority=10)
    x = torch.zeros(2, 8)
    assert [private_runtime.call(OP, x, 1e-6) for _ in range(5)] == ["fast"] * 5
    assert fast.asked == 1
    # a new tensor object with the same dtype, device, shape and strides: still cached
    assert private_runtime.call(OP, torch.ones(2, 8), 1e-6) == "fast" and fast.asked == 1
    # anything supports may read is part of the key: dtype, shape, strides, plain values
    assert private_runtime.call(OP, x.double(), 1e-6) == "reference" and fast.asked == 2
    assert private_runtime.call(OP, torch.zeros(2, 6), 1e-6) == "reference" and fast.asked == 3
    assert private_runtime.call(OP, torch.zeros(8, 2).T, 1e-6) == "fast" and fast.asked == 4
    assert private_runtime.call(OP, x, 1e-5) == "fast" and fast.asked == 5
    assert private_runtime.call(OP, x, eps=1e-6) == "fast" and fast.asked == 6
    assert private_runtime.call(OP, x, eps=1e-6) == "fast" and fast.asked == 6
    # the repeated declined signature is cached too
    assert private_runtime.call(OP, x.double(), 1e-6) == "reference" and fast.asked == 6


def test_equal_plain_values_of_other_types_are_other_keys(private_runtime):
    fast = counted("fast", accept=lambda x, flag: flag is True)
    private_runtime.register(OP, lambda *args: "reference")
    private_runtime.register(OP, fast, device="cpu", priority=10)
    x = torch.zeros(4)
    assert private_runtime.call(OP, x, True) == "fast"
    assert private_runtime.call(OP, x, 1) == "reference"  # 1 == True, but supports told them apart
    assert private_runtime.call(OP, x, 1.0) == "reference"
    assert fast.asked == 3


def test_calls_with_other_arguments_are_resolved_every_time(private_runtime):
    class Meta:  # e.g. attention metadata: its fields are not in a signature
        def __init__(self, ok):
            self.ok = ok

    fast = counted("fast", accept=lambda x, meta: meta.ok)
    private_runtime.register(OP, lambda *args: "reference")
    private_runtime.register(OP, fast, device="cpu", priority=10)
    x = torch.zeros(4)
    assert private_runtime.call(OP, x, Meta(True)) == "fast"
    assert private_runtime.call(OP, x, Meta(False)) == "reference"
    assert fast.asked == 2
    fast_list = counted("fast_list", accept=lambda x, sizes: sum(sizes) == 3)
    private_runtime.register(OP + "_list", fast_list, device="cpu")
    private_runtime.register(OP + "_list", lambda *args: "reference")
    assert private_runtime.call(OP + "_list", x, [1, 2]) == "fast_list"
    assert private_runtime.call(OP + "_list", x, [2, 2]) == "reference"
    assert fast_list.asked == 2


def test_register_drops_cached_resolutions(private_runtime):
    private_runtime.register(OP, lambda *args: "reference")
    x = torch.zeros(3)
    assert private_runtime.call(OP, x) == "reference"
    private_runtime.register(OP, counted("better"), device="cpu", priority=20)
    assert private_runtime.call(OP, x) == "better"


def test_invalidate_and_reset_drop_cached_resolutions(private_runtime):
    built = {"ok": True}  # state of the implementation's own, e.g. whether its module compiled
    fast = counted("fast", accept=lambda *args: built["ok"])
    private_runtime.register(OP, lambda *args: "reference")
    private_runtime.register(OP, fast, device="cpu", priority=10)
    x = torch.zeros(3)
    assert private_runtime.call(OP, x) == "fast"
    built["ok"] = False
    assert private_runtime.call(OP, x) == "fast"  # cached: the contract says to invalidate
    private_runtime.invalidate()
    assert private_runtime.call(OP, x) == "reference"
    private_runtime.reset()
    with pytest.raises(UnknownNameError, match=OP):  # everything forgotten; the registry does not know OP
        private_runtime.call(OP, x)


def test_compiled_module_reset_invalidates(private_runtime, monkeypatch):
    """Extension.reset() (tests force a failed build with it) empties the resolution cache."""
    from toolkit.kernels.gguf_cpu.build import Extension  # noqa: PLC0415

    private_runtime.register(OP, lambda *args: "reference")
    private_runtime.call(OP, torch.zeros(1))
    assert private_runtime._RESOLVED
    Extension("toolkit_test_unused", [], [], "nothing").reset()
    assert not private_runtime._RESOLVED


def test_address_alignment_is_part_of_the_key(private_runtime):
    """Kernels that read whole words decline misaligned views (triton_ops._packed_ok); a cached
    choice for an aligned tensor must not serve a view of the same shape at an odd address."""
    words = counted("words", accept=lambda data: data.data_ptr() % 4 == 0)
    private_runtime.register(OP, lambda data: "bytes")
    private_runtime.register(OP, words, device="cpu", priority=10)
    buffer = torch.zeros(64, dtype=torch.uint8)
    aligned, odd = buffer[:16], buffer[1:17]
    assert aligned.data_ptr() % 4 == 0 and odd.data_ptr() % 4 == 1
    assert private_runtime.call(OP, aligned) == "words"
    assert private_runtime.call(OP, odd) == "bytes"
    assert private_runtime.call(OP, aligned) == "words"
