"""Fused Triton kernels for a decoder layer's small ops (RMSNorm with residual add, rotary of q
and k, gated activation), registered for CUDA with the kernel runtime.

Registered only where Triton and a CUDA device exist; elsewhere (and for whatever a kernel's
``supports`` declines) the torch references in ``kernels/reference.py`` serve the same ops.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import optional_ops

PRIORITY = 10


@hookimpl
def register_kernels(register):
    for name, fn in optional_ops(f"{__name__}.ops", "fused Triton kernels").items():
        register(name, fn, device="cuda", priority=PRIORITY)
