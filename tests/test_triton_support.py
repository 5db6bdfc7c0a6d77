"""The shared gate for Triton kernel packages: nothing without Triton and a GPU, a warning (not a
failure) when the kernels' module cannot be imported, the module's OPS otherwise."""
from __future__ import annotations

import sys
import types

import pytest

from toolkit.kernels import triton_support


def test_nothing_registers_without_triton_or_a_gpu(monkeypatch):
    monkeypatch.setattr(triton_support, "triton_usable", lambda: False)
    assert triton_support.optional_ops("toolkit.kernels.gguf.triton_ops", "GGUF Triton kernels") == {}


def test_a_broken_import_warns_and_leaves_the_references(monkeypatch):
    monkeypatch.setattr(triton_support, "triton_usable", lambda: True)
    with pytest.warns(UserWarning, match="fused things unavailable, using the torch reference"):
        assert triton_support.optional_ops("toolkit.kernels.no_such_module", "fused things") == {}


def test_the_modules_ops_come_back(monkeypatch):
    module = types.ModuleType("fake_triton_kernels")
    module.OPS = {"op": print}
    monkeypatch.setitem(sys.modules, "fake_triton_kernels", module)
    monkeypatch.setattr(triton_support, "triton_usable", lambda: True)
    assert triton_support.optional_ops("fake_triton_kernels", "fake") == {"op": print}
