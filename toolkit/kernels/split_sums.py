"""A split-K matmul's result before its partial sums are added, handed to the op that reads it next.

Why: decode matmuls at 2-16 tokens (and a few at one) cut K into splits so that enough programs stream the
weight; each split writes float32 partial sums ``[S, T, N]`` and a second launch adds them (``sum_splits``). In a
batch-8 decode step of the 1.5B and 8B Llama GGUF files those sums were a launch per matmul, 2-3 us each, 11% and
5% of the step's kernel time (H100, ``bench/profile_decode.py --graphs``). The op after a projection (the residual
add with the next norm, the gated activation) reads its input once anyway: it adds the partials as it loads them.

- A caller whose next op can take them asks for them: ``LinearBase.forward(x, unreduced=True)``. The scheme may
  then return ``SplitSums`` instead of a tensor; unasked, no layer ever returns one.
- The consumer ops (``add_rms_norm_splits``, ``gated_activation_splits``) add ``parts`` in split order in float32
  and round the total to ``dtype``, as ``sum_splits`` writes it, then go on as their one-tensor ops do: the
  results are bit for bit those of the two launches.
- Anything else takes ``reduced(x)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from . import runtime


@dataclass(frozen=True)
class SplitSums:
    """``parts [S, T, N]`` float32 (S >= 2), whose sum over S rounded to ``dtype`` is the matmul's ``[T, N]``."""

    parts: torch.Tensor
    dtype: torch.dtype

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def total(self) -> torch.Tensor:
        """The ``[T, N]`` result in ``dtype`` (one ``sum_splits`` op)."""
        return runtime.call("sum_splits", self.parts, self.dtype)


def reduced(x: torch.Tensor | SplitSums) -> torch.Tensor:
    """``x`` as a tensor: split sums added up, a tensor as it is."""
    return x.total() if isinstance(x, SplitSums) else x


def sum_splits_reference(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float32 sum over the first axis in split order (as the kernels add), rounded to ``dtype``."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total.to(dtype)
