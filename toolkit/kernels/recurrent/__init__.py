"""Triton kernels for recurrent (Gated DeltaNet) layers on CUDA, registered with the runtime.

Registered only where Triton and a CUDA device exist (elsewhere, and for whatever a kernel's
``supports`` declines, the torch references in ``kernels/recurrent_reference.py`` serve):

* decode (``triton_ops``; one token per sequence, what CUDA graphs replay): the causal conv1d
  state update and the gated delta rule step, each one launch over the whole batch, reading and
  writing the state pool in place;
* prefill (``triton_prefill``; the flat varlen batch of prompts and prompt chunks): the causal
  conv1d over each sequence continuing from its window, and the chunked gated delta rule
  (chunks of 64, resuming from each sequence's state and writing its final state back).

The projection output needs no split kernel: the fused parameter is laid out ``[q|k|v|z|b|a]``
(contiguous per rank) whatever layout the checkpoint had, so q/k/v/z/b/a are views of it, and
the kernels read those strided views directly.
"""
from __future__ import annotations

from ...core.hookspecs import hookimpl
from ..triton_support import lazy_ops

PRIORITY = 10


@hookimpl
def register_kernels(register):
    for module, names, what in (
            ("triton_ops", ("causal_conv1d_decode", "gated_delta_rule_decode"), "recurrent decode Triton kernels"),
            ("triton_prefill", ("causal_conv1d_prefill", "gated_delta_rule_prefill"),
             "recurrent prefill Triton kernels")):
        for name, fn in lazy_ops(f"{__name__}.{module}", names, what).items():
            register(name, fn, device="cuda", priority=PRIORITY)
