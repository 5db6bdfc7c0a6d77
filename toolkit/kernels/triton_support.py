"""Whether Triton kernels can register on this machine, and their lazy, failure-tolerant import.

Every Triton kernel package registers for CUDA only where a GPU and Triton exist. It registers
``LazyKernel`` stand-ins named after its ops, not the kernels themselves: importing Triton and
defining the kernels costs a good part of a second, and loading a model dispatches no kernel, so
``toolkit.load`` never pays it. The kernel runtime asks a stand-in for its function
(``materialize``) the first time a call could go to it; that imports the kernels' module once,
and from then on the runtime dispatches to (and caches) the real function, so the stand-in
costs nothing per call. A broken Triton install must not take the torch reference ops down with
it: the import failure becomes a one-line warning and the stand-in declines every call.
The first import also puts Triton's compiler key memo in place (triton_key_memo.py).
"""
from __future__ import annotations

import importlib
import importlib.util
import warnings
from typing import Callable

import torch

from . import triton_key_memo


def triton_usable() -> bool:
    """A CUDA device is visible and Triton is installed (without importing Triton)."""
    return torch.cuda.is_available() and importlib.util.find_spec("triton") is not None


class LazyKernel:
    """The op ``name`` of ``module.OPS``, imported when the runtime first needs it."""

    def __init__(self, module: str, name: str, what: str) -> None:
        self.module, self.name, self.what = module, name, what
        self.__name__ = self.__qualname__ = f"lazy {module}.{name}"

    def materialize(self) -> Callable | None:
        """The kernel, importing its module the first time; None when that import fails (warned
        about once per module) or the module's ``OPS`` lacks the name."""
        state = _MODULES.get(self.module)
        if state is None:
            try:
                # before any kernel is looked up: Triton's compiler key from disk, not rehashed per process
                triton_key_memo.install()
                state = _MODULES[self.module] = importlib.import_module(self.module).OPS
            except Exception as exc:  # noqa: BLE001 - any import failure leaves the references serving
                state = _MODULES[self.module] = exc
                warnings.warn(f"{self.what} unavailable, using the torch reference: {exc}", stacklevel=3)
        return None if isinstance(state, Exception) else state.get(self.name)

    def supports(self, *args, **kwargs) -> bool:
        fn = self.materialize()
        check = getattr(fn, "supports", None)
        return fn is not None and (check is None or bool(check(*args, **kwargs)))

    def __call__(self, *args, **kwargs):
        fn = self.materialize()
        if fn is None:
            raise RuntimeError(f"{self.what} unavailable ({self.module}.{self.name})")
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"LazyKernel({self.module!r}, {self.name!r})"


# module -> its OPS once imported, or the exception its import raised
_MODULES: dict[str, dict | Exception] = {}
# (module, op) -> its one stand-in: a rebuilt registry re-registers the same object, which the
# runtime's install() recognises instead of adding a duplicate
_STAND_INS: dict[tuple[str, str], LazyKernel] = {}


def lazy_ops(module: str, names: tuple[str, ...], what: str) -> dict[str, LazyKernel]:
    """Stand-ins for ``module.OPS[name]`` per name where Triton is usable, else ``{}``.

    :param module: the absolute name of the module holding the Triton kernels' ``OPS``
    :param names: the ops it provides (its ``OPS`` keys; tests/test_triton_support.py checks them)
    :param what: how the warning names them when the import fails
    """
    if not triton_usable():
        return {}
    return {name: _STAND_INS.setdefault((module, name), LazyKernel(module, name, what)) for name in names}
