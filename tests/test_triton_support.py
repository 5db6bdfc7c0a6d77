"""The shared gate for Triton kernel packages: nothing without Triton and a GPU; otherwise
stand-ins that import the kernels' module only when the runtime first dispatches to them, a
warning (not a failure) when that import fails, and the op names each package declares equal to
its module's OPS."""
from __future__ import annotations

import ast
import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import torch

from toolkit.kernels import triton_support


@pytest.fixture
def usable(monkeypatch):
    """Triton "usable", with stand-in and import state private to the test."""
    monkeypatch.setattr(triton_support, "triton_usable", lambda: True)
    monkeypatch.setattr(triton_support, "_MODULES", {})
    monkeypatch.setattr(triton_support, "_STAND_INS", {})


@pytest.fixture
def private_runtime(monkeypatch):
    from toolkit.kernels import runtime  # noqa: PLC0415

    monkeypatch.setattr(runtime, "_OPS", {})
    monkeypatch.setattr(runtime, "_CANDIDATES", {})
    monkeypatch.setattr(runtime, "_RESOLVED", {})
    return runtime


def _fake_module(monkeypatch, name: str, ops: dict) -> None:
    module = types.ModuleType(name)
    module.OPS = ops
    monkeypatch.setitem(sys.modules, name, module)


def test_nothing_registers_without_triton_or_a_gpu(monkeypatch):
    monkeypatch.setattr(triton_support, "triton_usable", lambda: False)
    assert triton_support.lazy_ops("toolkit.kernels.gguf.triton_ops", ("gguf_matmul",), "GGUF Triton kernels") == {}


def test_registering_imports_nothing(usable):
    stand_ins = triton_support.lazy_ops("toolkit_test_never_imported", ("op",), "fake")
    assert list(stand_ins) == ["op"]
    assert "toolkit_test_never_imported" not in sys.modules
    assert "toolkit_test_never_imported" not in triton_support._MODULES


def test_a_broken_import_warns_once_and_declines(usable):
    stand_in = triton_support.lazy_ops("toolkit.kernels.no_such_module", ("op",), "fused things")["op"]
    with pytest.warns(UserWarning, match="fused things unavailable, using the torch reference"):
        assert stand_in.materialize() is None
    assert not stand_in.supports(torch.zeros(1))
    with pytest.raises(RuntimeError, match="fused things unavailable"):
        stand_in(torch.zeros(1))


def test_the_modules_op_comes_back(usable, monkeypatch):
    _fake_module(monkeypatch, "fake_triton_kernels", {"op": print})
    stand_in = triton_support.lazy_ops("fake_triton_kernels", ("op",), "fake")["op"]
    assert stand_in.materialize() is print
    assert triton_support.lazy_ops("fake_triton_kernels", ("op",), "fake")["op"] is stand_in  # one per op


def test_the_runtime_imports_on_first_dispatch_and_then_calls_the_real_function(usable, private_runtime,
                                                                                monkeypatch):
    calls = []

    def double(x):
        calls.append("kernel")
        return x * 2

    double.supports = lambda x: x.dtype == torch.float32

    def reference(x):
        calls.append("reference")
        return x + x

    spec = {"imported": False}

    class Finder:  # imports fake_lazy_kernels on demand, recording that it happened
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name != "fake_lazy_kernels":
                return None
            return importlib.util.spec_from_loader(name, Loader())

    class Loader:
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            spec["imported"] = True
            module.OPS = {"double": double}

    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    monkeypatch.delitem(sys.modules, "fake_lazy_kernels", raising=False)
    private_runtime.register("double", reference, device="any")
    for name, fn in triton_support.lazy_ops("fake_lazy_kernels", ("double",), "fake").items():
        private_runtime.register(name, fn, device="cpu", priority=10)
    assert not spec["imported"]
    x = torch.ones(3)
    assert private_runtime.resolve("double", x) is double  # the real function, not the stand-in
    assert spec["imported"]
    torch.testing.assert_close(private_runtime.call("double", x), torch.full((3,), 2.0))
    assert private_runtime.resolve("double", x.double()) is reference  # its supports declined
    assert calls == ["kernel"]


def test_a_broken_kernel_module_leaves_the_reference_serving(usable, private_runtime):
    private_runtime.register("triple", lambda x: x * 3, device="any")
    for name, fn in triton_support.lazy_ops("toolkit.kernels.no_such_module", ("triple",), "fake").items():
        private_runtime.register(name, fn, device="cpu", priority=10)
    with pytest.warns(UserWarning, match="fake unavailable"):
        torch.testing.assert_close(private_runtime.call("triple", torch.ones(2)), torch.full((2,), 3.0))


KERNEL_PACKAGES = ("toolkit.kernels.gguf", "toolkit.kernels.fused", "toolkit.kernels.recurrent",
                   "toolkit.kernels.moe", "toolkit.kernels.gguf_moe", "toolkit.kernels.attention", "toolkit.kernels.bnb")


def _ops_keys(module: str) -> set[str]:
    """The keys of ``OPS = {...}`` in the module's source (parsed: Triton is not importable here)."""
    tree = ast.parse(Path(importlib.util.find_spec(module).origin).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "OPS" for t in node.targets):
            assert isinstance(node.value, ast.Dict), f"{module}.OPS is not a dict literal"
            return {key.value for key in node.value.keys}
    raise AssertionError(f"{module} has no OPS")


def test_declared_op_names_match_each_kernel_modules_ops(usable):
    """Each package names its Triton ops without importing them; those names must be the
    module's OPS keys (a kernel added to OPS but not declared would never register)."""
    declared: dict[str, set[str]] = {}

    def register(op_name, fn, device="any", priority=0):
        if isinstance(fn, triton_support.LazyKernel):
            assert (device, fn.name) == ("cuda", op_name)
            declared.setdefault(fn.module, set()).add(op_name)

    for package in KERNEL_PACKAGES:
        importlib.import_module(package).register_kernels(register)
    assert len(declared) == 8, declared
    for module, names in declared.items():
        assert names == _ops_keys(module), module
