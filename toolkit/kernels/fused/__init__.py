"""Fused Triton kernels for a decoder layer's small ops (RMSNorm with residual add, rotary of q
and k, gated activation), registered for CUDA with the kernel runtime.

Registered only where Triton and a CUDA device exist; elsewhere (and for whatever a kernel's
``supports`` declines) the torch references in ``kernels/reference.py`` serve the same ops.
"""
from __future__ import annotations

import importlib.util
import warnings

import torch

from ...core.hookspecs import hookimpl

PRIORITY = 10


@hookimpl
def register_kernels(register):
    if importlib.util.find_spec("triton") is None or not torch.cuda.is_available():
        return
    try:
        from .ops import OPS  # noqa: PLC0415 - Triton is optional and slow to import
    except Exception as exc:  # noqa: BLE001 - a broken Triton must not take the references down
        warnings.warn(f"fused Triton kernels unavailable, using the torch references: {exc}", stacklevel=2)
        return
    for name, fn in OPS.items():
        register(name, fn, device="cuda", priority=PRIORITY)
