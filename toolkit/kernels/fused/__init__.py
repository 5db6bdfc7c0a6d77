"""Fused Triton kernels for a decoder layer's small ops (RMSNorm with residual add, rotary of q
and k, rotary with the paged KV-cache write, gated activation), registered for CUDA with the
kernel runtime.

Registered only where Triton and a CUDA device exist; elsewhere (and for whatever a kernel's
``supports`` declines) the torch references in ``kernels/reference.py`` serve the same ops.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops

PRIORITY = 10
TRITON_OPS = ("rms_norm", "add_rms_norm", "rotary_qk", "rotary_store_kv", "qk_norm_rotary_store_kv",
              "gated_activation", "rms_norm_int8", "add_rms_norm_int8", "gated_activation_int8",
              "sum_splits", "add_rms_norm_splits", "gated_activation_splits", "rotary_store_kv_splits")  # ops.OPS


@hookimpl
def register_kernels(register):
    for name, fn in lazy_ops(f"{__name__}.ops", TRITON_OPS, "fused Triton kernels").items():
        register(name, fn, device="cuda", priority=PRIORITY)
