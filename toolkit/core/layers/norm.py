"""RMSNorm through the kernel runtime. ``weight_offset=1.0`` gives Gemma's ``x * (1 + w)``.

``feeds``: the module the normalised output goes to (a linear layer, an attention or MLP block). When it
reads activations rounded to int8 blocks (``int8_input``, see ``kernels/int8_blocks.py``: some quantized decode
kernels), the norm's kernel writes them too and they travel with the output, saving the consumer a launch.
``forward_add`` also takes a projection's output as split-K partial sums (``kernels/split_sums.py``) and adds
them in its kernel, saving their own launch.
"""
from __future__ import annotations

import torch
from torch import nn

from ...kernels import runtime
from ...kernels.int8_blocks import attach, requested
from ...kernels.split_sums import SplitSums, reduced, unpieced
from ..params import ModelParameter


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, *, weight_offset: float = 0.0,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.eps, self.weight_offset = eps, weight_offset
        self.weight = ModelParameter(torch.ones(hidden_size, dtype=dtype))

    def forward(self, x: torch.Tensor | SplitSums, feeds=None) -> torch.Tensor:
        x = reduced(x)
        request = requested(feeds, x.numel() // x.shape[-1])
        if request is None:
            return runtime.call("rms_norm", x, self.weight, self.eps, self.weight_offset)
        out, *blocks = runtime.call("rms_norm_int8", x, self.weight, self.eps, self.weight_offset, request.sums)
        return attach(out, *blocks)

    def forward_add(self, x: torch.Tensor | SplitSums, residual: torch.Tensor,
                    feeds=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` as one op (a pre-norm block's residual add); ``x`` may be split
        sums (``kernels/split_sums.py``), added up in the same op."""
        request = requested(feeds, residual.numel() // residual.shape[-1])
        x = unpieced(x)                             # column pieces of a several-type weight
        if isinstance(x, SplitSums):
            out, total, *blocks = runtime.call("add_rms_norm_splits", x.parts, residual, self.weight, self.eps,
                                               self.weight_offset, None if request is None else request.sums)
            return (out if request is None else attach(out, *blocks)), total
        if request is None:
            return runtime.call("add_rms_norm", x, residual, self.weight, self.eps, self.weight_offset)
        out, total, *blocks = runtime.call("add_rms_norm_int8", x, residual, self.weight, self.eps,
                                           self.weight_offset, request.sums)
        return attach(out, *blocks), total

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        getattr(self, param_name).load_replicated(loaded)
