"""Compiled CPU kernels for a decoder layer's small ops (C++, built on first use like ``gguf_cpu``).

Registers, for ``device="cpu"``, ``rms_norm``, ``add_rms_norm``, ``rotary_qk``, ``gated_activation``,
``store_kv`` and ``paged_attention`` above the torch references (which stay the test oracle and
serve whatever ``supports`` declines: non-float32 tensors, a failed build). At one decode token
these ops handle a few KiB each and the references' cost was almost all per-ATen-call overhead
(~10-20 calls per op, ~100 norms per Gemma 3 270M token). ``TOOLKIT_CPU_FUSED=0`` turns them off.
"""
from __future__ import annotations

import os

from ...core.hookspecs import hookimpl
from .ops import OPS

PRIORITY = 10


@hookimpl
def register_kernels(register):
    if os.environ.get("TOOLKIT_CPU_FUSED", "1") == "0":
        return
    for name, fn in OPS.items():
        register(name, fn, device="cpu", priority=PRIORITY)
