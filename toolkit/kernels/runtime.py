"""The kernel runtime: ops by name, dispatched by device and shape.

Every op has a pure-torch reference registered for ``device="any"``; that reference is the
test oracle and what runs on CPU. Faster implementations (Triton on CUDA) register with a
higher priority and may offer ``supports(*args, **kwargs) -> bool`` to decline a call
(an odd shape, a type they do not handle), in which case the next candidate runs.

Callers never import a kernel module: ``runtime.call("rms_norm", x, weight, eps)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..core.errors import UnknownNameError


@dataclass(frozen=True)
class OpImpl:
    op_name: str
    fn: Callable
    device: str  # "any", "cpu" or "cuda"
    priority: int
    owner: str


_OPS: dict[str, list[OpImpl]] = {}
# (op, device) -> candidates, best first; rebuilt on every register (an eager forward resolves
# hundreds of ops per step, so the filtering is done once, not per call)
_CANDIDATES: dict[tuple[str, str], list[OpImpl]] = {}


def register(op_name: str, fn: Callable, device: str = "any", priority: int = 0, owner: str = "(direct)") -> None:
    """Add an implementation; candidates are kept best-first."""
    impls = _OPS.setdefault(op_name, [])
    impls.append(OpImpl(op_name, fn, device, priority, owner))
    impls.sort(key=lambda impl: (impl.device == "any", -impl.priority))
    _CANDIDATES.clear()


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


def resolve(op_name: str, *args, **kwargs) -> Callable:
    """The implementation that would run for these arguments."""
    for impl in candidates(op_name, _device_of(args)):
        supports = getattr(impl.fn, "supports", None)
        if supports is None or supports(*args, **kwargs):
            return impl.fn
    raise UnknownNameError("kernel op for this device/shape", op_name, [i.owner for i in _OPS[op_name]])


def call(op_name: str, *args, **kwargs):
    return resolve(op_name, *args, **kwargs)(*args, **kwargs)


def reset() -> None:
    """Forget every registered implementation; the next lookup reinstalls what the (possibly
    reconfigured) plugin registry provides. Tests that narrow ``TOOLKIT_PLUGINS`` call this with
    ``reset_default_registry()``, so kernels an earlier test installed do not linger."""
    _OPS.clear()
    _CANDIDATES.clear()


def reference(op_name: str) -> Callable:
    """The device-independent reference implementation (the oracle in tests)."""
    for impl in candidates(op_name, "any"):
        if impl.device == "any":
            return impl.fn
    raise UnknownNameError("reference op", op_name, list(_OPS))


def _ensure_registry() -> None:
    from ..core.registry import default_registry  # noqa: PLC0415 - avoids an import cycle

    default_registry()
