"""A split-K matmul's result before its partial sums are added, handed to the op that reads it next.

Why: decode matmuls at 2-64 tokens (and a few at one) cut K into splits so that enough programs stream the
weight; each split writes float32 partial sums ``[S, T, N]`` and a second launch adds them (``sum_splits``). In a
batch-8 decode step of the 1.5B and 8B Llama GGUF files those sums were a launch per matmul, 2-3 us each, 11% and
5% of the step's kernel time (H100, ``bench/profile_decode.py --graphs``). The op after a projection (the residual
add with the next norm, the gated activation) reads its input once anyway: it adds the partials as it loads them.

- The int8 kernels (1-16 tokens) hand them on, and the 16-bit kernels (17-64 tokens) for Q4_K and Q6_K weights
  (``dot16_ops.DOT16_UNREDUCED_TYPES``: +4-6% at batch 32 and 64 of the 8B Q4_K_M file, H100); Q4_0's reduce their
  own: handed on, a batch-32 decode step of the 1.5B Q4_0 file ran 7.5-8% slower (sessions 15 and 25).
- A caller whose next op can take them asks for them: ``LinearBase.forward(x, unreduced=True)``. The scheme may
  then return ``SplitSums`` instead of a tensor; unasked, no layer ever returns one.
- The consumer ops (``add_rms_norm_splits``, ``gated_activation_splits``) add ``parts`` in split order in float32
  and round the total to ``dtype``, as ``sum_splits`` writes it, then go on as their one-tensor ops do: the
  results are bit for bit those of the two launches, but for one case found in session 25: float16 norm outputs
  with int8 blocks were 1 ulp off on a few elements in 10^5 (H100; cause not established).
- A weight whose rows have several quant types answers with ``Columns``, one piece per type; ``split_columns`` cuts
  a fused q/k/v output into its parts, each still lazy where it lies inside one piece. The rotary op that stores k
  and v (``rotary_store_kv_splits``) adds q's, k's and v's partials as it loads them.
- Anything else takes ``reduced(x)``.
"""
from __future__ import annotations

import torch

from . import runtime
from ..core.records import FrozenRecord

# SplitSums and Columns are hand-written records, not dataclasses: every load imports this module, and defining a
# dataclass costs ~0.5-1 ms (core/records.py).


class SplitSums(FrozenRecord):
    """``parts [S, T, N]`` float32 (S >= 2), whose sum over S rounded to ``dtype`` is the matmul's ``[T, N]``."""

    parts: torch.Tensor
    dtype: torch.dtype

    def __init__(self, parts: torch.Tensor, dtype: torch.dtype):
        self.__dict__.update(parts=parts, dtype=dtype)

    @property
    def shape(self) -> torch.Size:
        return self.parts.shape[1:]

    def total(self) -> torch.Tensor:
        """The ``[T, N]`` result in ``dtype`` (one ``sum_splits`` op)."""
        return runtime.call("sum_splits", self.parts, self.dtype)


class Columns(FrozenRecord):
    """A layer's output computed in column ranges side by side (a weight whose rows have several quant types, one
    matmul each): ``pieces`` of ``[T, N_i]``, each a tensor or ``SplitSums``, together ``[T, sum N_i]``."""

    pieces: tuple

    def __init__(self, pieces: tuple):
        self.__dict__.update(pieces=pieces)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.pieces[0].shape[0], sum(piece.shape[1] for piece in self.pieces)))


def reduced(x: torch.Tensor | SplitSums | Columns) -> torch.Tensor:
    """``x`` as a tensor: split sums added up, column pieces side by side, a tensor as it is."""
    if isinstance(x, Columns):
        pieces = [reduced(piece) for piece in x.pieces]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=-1)
    return x.total() if isinstance(x, SplitSums) else x


def unpieced(x: torch.Tensor | SplitSums | Columns) -> torch.Tensor | SplitSums:
    """``x`` for an op that takes a tensor or split sums: ``Columns`` reduced, anything else as it is."""
    return reduced(x) if isinstance(x, Columns) else x


def split_columns(x: torch.Tensor | SplitSums | Columns, sizes: list[int]) -> tuple:
    """``x`` cut into consecutive column ranges of ``sizes`` (as ``Tensor.split(sizes, -1)``), each as lazy as it
    can stay: a range of a ``SplitSums`` is the same columns of its partials, a range inside one piece of
    ``Columns`` is that piece's; a range across pieces is cut from the reduced whole."""
    if isinstance(x, torch.Tensor):
        return x.split(sizes, dim=-1)
    bounds, start = [], 0
    for piece in x.pieces if isinstance(x, Columns) else (x,):
        bounds.append((start, start + piece.shape[1], piece))
        start += piece.shape[1]
    out, start, whole = [], 0, None
    for size in sizes:
        inside = [(lo, piece) for lo, hi, piece in bounds if lo <= start and start + size <= hi]
        if inside:
            lo, piece = inside[0]
            out.append(_narrow(piece, start - lo, size))
        else:
            whole = reduced(x) if whole is None else whole
            out.append(whole[:, start:start + size])
        start += size
    return tuple(out)


def _narrow(x: torch.Tensor | SplitSums, start: int, size: int) -> torch.Tensor | SplitSums:
    if isinstance(x, SplitSums):
        return SplitSums(x.parts[:, :, start:start + size], x.dtype)
    return x[:, start:start + size]


def as_parts(x: torch.Tensor | SplitSums) -> torch.Tensor:
    """``x`` as partials ``[S, T, N]`` for a kernel that adds them (``triton_reduce.load_summed``): a tensor is its
    own single part (S = 1, in its own dtype)."""
    return x.parts if isinstance(x, SplitSums) else x.unsqueeze(0)


def sum_splits_reference(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float32 sum over the first axis in split order (as the kernels add), rounded to ``dtype``."""
    total = parts[0].clone()
    for part in parts[1:]:
        total += part
    return total.to(dtype)
