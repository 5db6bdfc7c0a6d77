"""Tensor-parallel context on torch.distributed (gloo on CPU, NCCL on CUDA).

Layers receive a ParallelContext and use only ``tp_rank``, ``tp_size``, ``all_reduce`` and
``all_gather``; with tp_size 1 these are free no-ops, so a single-process model never
touches torch.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class ParallelContext:
    tp_rank: int = 0
    tp_size: int = 1
    group: Any = None

    @property
    def is_distributed(self) -> bool:
        return self.tp_size > 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp_size > 1:
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Concatenate every rank's ``x`` along ``dim`` (all ranks get the result)."""
        if self.tp_size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.tp_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)


SINGLE = ParallelContext()
