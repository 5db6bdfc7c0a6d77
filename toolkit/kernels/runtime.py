"""The kernel runtime: ops by name, dispatched by device and shape.

Every op has a pure-torch reference registered for ``device="any"``; that reference is the
test oracle and what runs on CPU. Faster implementations (Triton on CUDA) register with a
higher priority and may offer ``supports(*args, **kwargs) -> bool`` to decline a call
(an odd shape, a type they do not handle), in which case the next candidate runs. An
implementation with a ``materialize()`` method is a stand-in for one imported on first use
(``triton_support.LazyKernel``): the runtime asks it for the real function when a call first
reaches it and dispatches to that (None: unavailable, skipped).

Callers never import a kernel module: ``runtime.call("rms_norm", x, weight, eps)``.

Resolution is cached. ``supports`` must decide from what the *signature* of the call holds: each
tensor argument's dtype, device, shape, strides and address alignment (``data_ptr() % 16``: kernels
that read whole words check it), and the value of each plain argument (``None``,
bool, int, float, str, ``torch.dtype``), plus state of its own that only changes together with an
``invalidate()`` (a compiled module built or reset); never from tensor contents. The runtime then
remembers, per (op, signature), which implementation ``supports`` picked, so the hundreds of calls
of a decode step each cost a dictionary lookup instead of a walk over ``supports`` checks. A call
with any other kind of argument (an attention-metadata object, a list) is resolved afresh every
time. ``register``, ``reset`` and ``invalidate`` empty the cache.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..core.errors import UnknownNameError
from ..core.records import FrozenRecord


class OpImpl(FrozenRecord):
    """One registered implementation of an op. A hand-written record, not a dataclass: every load imports this
    module, and defining a dataclass costs ~0.5-1 ms (``core/records.py``)."""

    op_name: str
    fn: Callable
    device: str  # "any", "cpu" or "cuda"
    priority: int
    owner: str

    def __init__(self, op_name: str, fn: Callable, device: str, priority: int, owner: str):
        self.__dict__.update(op_name=op_name, fn=fn, device=device, priority=priority, owner=owner)


_OPS: dict[str, list[OpImpl]] = {}
# (op, device) -> candidates, best first; rebuilt on every register (an eager forward resolves
# hundreds of ops per step, so the filtering is done once, not per call)
_CANDIDATES: dict[tuple[str, str], list[OpImpl]] = {}
# (op, signature of the call) -> the implementation resolve() chose (see the module docstring)
_RESOLVED: dict[tuple, Callable] = {}
_RESOLVED_MAX = 4096  # prefill shapes vary with the prompt: start over rather than grow without end
_Tensor = torch.Tensor
_PLAIN = (type(None), bool, int, float, str, torch.dtype)


def register(op_name: str, fn: Callable, device: str = "any", priority: int = 0, owner: str = "(direct)") -> None:
    """Add an implementation; candidates are kept best-first."""
    impls = _OPS.setdefault(op_name, [])
    impls.append(OpImpl(op_name, fn, device, priority, owner))
    impls.sort(key=lambda impl: (impl.device == "any", -impl.priority))
    invalidate()


def install(entries) -> None:
    """Register what plugins gave through ``register_kernels`` (called once by the registry)."""
    for op_name, fn, device, priority, owner in entries:
        if not any(impl.fn is fn for impl in _OPS.get(op_name, [])):
            register(op_name, fn, device, priority, owner)


def _device_of(args) -> str:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device.type
    return "cpu"


def candidates(op_name: str, device: str) -> list[OpImpl]:
    found = _CANDIDATES.get((op_name, device))
    if found is not None:
        return found
    if op_name not in _OPS:
        _ensure_registry()
    if op_name not in _OPS:
        raise UnknownNameError("kernel op", op_name, list(_OPS))
    found = _CANDIDATES[(op_name, device)] = [impl for impl in _OPS[op_name] if impl.device in (device, "any")]
    return found


def _signature(op_name: str, args, kwargs) -> tuple | None:
    """What ``supports`` may look at (module docstring), as a dict key; None: not cacheable."""
    key = [op_name]
    for arg in args:
        if isinstance(arg, _Tensor):
            key.append((arg.dtype, arg.device, arg.shape, arg.stride(), arg.data_ptr() % 16))
        elif isinstance(arg, _PLAIN):
            key.append((arg.__class__, arg))  # the class too: 1, 1.0 and True are equal keys
        else:
            return None
    if kwargs:
        for name, arg in sorted(kwargs.items()):
            if isinstance(arg, _Tensor):
                key.append((name, arg.dtype, arg.device, arg.shape, arg.stride(), arg.data_ptr() % 16))
            elif isinstance(arg, _PLAIN):
                key.append((name, arg.__class__, arg))
            else:
                return None
    return tuple(key)


def _choose(op_name: str, args, kwargs) -> Callable:
    for impl in candidates(op_name, _device_of(args)):
        fn = impl.fn
        materialize = getattr(fn, "materialize", None)
        if materialize is not None:  # a lazily imported kernel (triton_support.LazyKernel)
            fn = materialize()
            if fn is None:  # its module failed to import (warned once): the next candidate serves
                continue
        supports = getattr(fn, "supports", None)
        if supports is None or supports(*args, **kwargs):
            return fn
    raise UnknownNameError("kernel op for this device/shape", op_name, [i.owner for i in _OPS[op_name]])


def resolve(op_name: str, *args, **kwargs) -> Callable:
    """The implementation that would run for these arguments (cached per call signature)."""
    key = _signature(op_name, args, kwargs)
    if key is None:
        return _choose(op_name, args, kwargs)
    fn = _RESOLVED.get(key)
    if fn is None:
        fn = _choose(op_name, args, kwargs)
        if len(_RESOLVED) >= _RESOLVED_MAX:
            _RESOLVED.clear()
        _RESOLVED[key] = fn
    return fn


def call(op_name: str, *args, **kwargs):
    return resolve(op_name, *args, **kwargs)(*args, **kwargs)


def invalidate() -> None:
    """Forget cached resolutions (not the registrations): call it when something a ``supports``
    reads besides the call's signature changes, e.g. a compiled kernel module is reset."""
    _CANDIDATES.clear()
    _RESOLVED.clear()


def reset() -> None:
    """Forget every registered implementation; the next lookup reinstalls what the (possibly
    reconfigured) plugin registry provides. Tests that narrow ``TOOLKIT_PLUGINS`` call this with
    ``reset_default_registry()``, so kernels an earlier test installed do not linger."""
    _OPS.clear()
    invalidate()


def reference(op_name: str) -> Callable:
    """The device-independent reference implementation (the oracle in tests)."""
    for impl in candidates(op_name, "any"):
        if impl.device == "any":
            return impl.fn
    raise UnknownNameError("reference op", op_name, list(_OPS))


def _ensure_registry() -> None:
    from ..core.registry import default_registry  # noqa: PLC0415 - avoids an import cycle

    default_registry()
