"""Triton paged attention and KV store for CUDA, registered with the kernel runtime.

Registered only where Triton and a CUDA device exist; elsewhere the torch references in
``kernels/reference.py`` serve the same ops. The kernels are wrapped as torch custom ops
(``torch.ops.toolkit.paged_attention`` / ``store_kv``) so torch.compile and CUDA graph
capture see them as single opaque ops.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import triton_usable

PRIORITY = 10


@hookimpl
def register_kernels(register):
    if not triton_usable():
        return
    from . import ops  # noqa: PLC0415 - imports triton

    register("paged_attention", ops.paged_attention, device="cuda", priority=PRIORITY)
    register("store_kv", ops.store_kv, device="cuda", priority=PRIORITY)
