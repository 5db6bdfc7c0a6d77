"""Triton paged attention and KV store for CUDA, registered with the kernel runtime.

Registered only where Triton and a CUDA device exist, and imported on the first call that reaches
them (``triton_support.lazy_ops``); elsewhere the torch references in
``kernels/reference.py`` serve the same ops. The kernels are wrapped as torch custom ops
(``torch.ops.toolkit.paged_attention`` / ``store_kv``) so torch.compile and CUDA graph
capture see them as single opaque ops.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops

PRIORITY = 10


@hookimpl
def register_kernels(register):
    ops = ("paged_attention", "paged_attention_int8", "store_kv")
    for name, fn in lazy_ops(f"{__name__}.ops", ops, "Triton paged attention").items():
        register(name, fn, device="cuda", priority=PRIORITY)
