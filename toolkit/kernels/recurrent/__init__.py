"""Triton decode kernels for recurrent (Gated DeltaNet) layers on CUDA, registered with the runtime.

Registered only where Triton and a CUDA device exist. Decode (one token per sequence, what
CUDA graphs replay) runs here: the causal conv1d state update and the gated delta rule step,
each one kernel launch over the whole batch reading and writing the state pool in place.
Prefill (conv over a prompt, chunked gated delta rule) uses the torch references in
``kernels/recurrent_reference.py`` on every device: they run per sequence and per 64-token
chunk as a handful of batched matmuls and one triangular solve on the GPU.

The projection output needs no split kernel: the fused parameter is laid out ``[q|k|v|z|b|a]``
(contiguous per rank), so q/k/v/z/b/a are views of it, whatever layout the checkpoint had.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import triton_usable

PRIORITY = 10


@hookimpl
def register_kernels(register):
    if not triton_usable():
        return
    from . import triton_ops  # noqa: PLC0415 - imports triton

    register("causal_conv1d_decode", triton_ops.causal_conv1d_decode, device="cuda", priority=PRIORITY)
    register("gated_delta_rule_decode", triton_ops.gated_delta_rule_decode, device="cuda", priority=PRIORITY)
