"""RMSNorm through the kernel runtime. ``weight_offset=1.0`` gives Gemma's ``x * (1 + w)``."""
from __future__ import annotations

import torch
from torch import nn

from ...kernels import runtime
from ..params import ModelParameter


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6, *, weight_offset: float = 0.0,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self.eps, self.weight_offset = eps, weight_offset
        self.weight = ModelParameter(torch.ones(hidden_size, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return runtime.call("rms_norm", x, self.weight, self.eps, self.weight_offset)

    def forward_add(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)`` as one op (a pre-norm block's residual add)."""
        return runtime.call("add_rms_norm", x, residual, self.weight, self.eps, self.weight_offset)

    def load_weight(self, param_name: str, loaded, shard_id: int | None) -> None:
        getattr(self, param_name).load_replicated(loaded)
