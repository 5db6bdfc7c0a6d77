"""One-launch sums of partial results on CUDA (Triton): ``out[m, n] = sum_s x[m, s, n]`` in float32,
in the order s = 0, 1, ..., written in ``out``'s dtype.

Why: a split-K matmul's partial sums and an MoE layer's per-route outputs were reduced with
``torch.sum`` followed by a cast, two launches and a float32 round trip through memory each; in a
batch-8 decode step of an 8B GGUF model those pairs took ~0.5 ms of ~9.4 ms of kernels.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .split_sums import SplitSums
from .triton_pdl import launch_options, wait_for_previous


@triton.jit
def load_summed(ptrs, mask, SPLITS: tl.constexpr, stride_split, dtype: tl.constexpr):
    """``ptrs``' values in ``dtype``, or with ``SPLITS`` > 1 the sum of ``SPLITS`` float32 partials ``stride_split``
    elements apart (a split-K matmul's, ``kernels/split_sums``), added in split order and rounded to ``dtype`` as
    ``sum_middle_kernel`` writes them: an op reading a projection's output adds its partials on the way in."""
    if SPLITS == 1:
        return tl.load(ptrs, mask=mask, other=0.0)
    acc = tl.load(ptrs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLITS):
        acc += tl.load(ptrs + s * stride_split, mask=mask, other=0.0)
    return acc.to(dtype)


@triton.jit
def sum_middle_kernel(x_ptr, out_ptr, N, stride_m, stride_s, S: tl.constexpr, BN: tl.constexpr,
                      PDL: tl.constexpr = False):
    wait_for_previous(PDL)                                          # kernels/triton_pdl
    m, pid_n = tl.program_id(0), tl.program_id(1)
    n = pid_n * BN + tl.arange(0, BN)
    ok = n < N
    row = x_ptr + m.to(tl.int64) * stride_m + n
    acc = tl.zeros((BN,), dtype=tl.float32)
    for s in tl.static_range(S):
        acc += tl.load(row + s * stride_s, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m.to(tl.int64) * N + n, acc.to(out_ptr.dtype.element_ty), mask=ok)


def sum_middle(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x [M, S, N]`` (last axis contiguous) -> ``[M, N]`` in ``dtype``: the float32 sum over S."""
    rows, parts, cols = x.shape
    assert x.stride(2) == 1, "the summed rows must be contiguous"
    out = torch.empty(rows, cols, dtype=dtype, device=x.device)
    if out.numel():
        bn = min(1024, triton.next_power_of_2(cols))
        sum_middle_kernel[(rows, triton.cdiv(cols, bn))](x, out, cols, x.stride(0), x.stride(1), S=parts, BN=bn,
                                                          num_warps=4 if bn >= 512 else 1, **launch_options(x.device))
    return out


def sum_splits(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``partial [S, T, N]`` (a split-K matmul's partial products) -> ``[T, N]`` in ``dtype``."""
    return sum_middle(partial.permute(1, 0, 2), dtype)


def split_output(split: int, tokens: int, rows: int, x: torch.Tensor) -> torch.Tensor:
    """The ``[split, T, N]`` output of a split-K matmul kernel: in x's dtype when K is not split (the
    kernel writes the result itself), else float32 partial sums for ``finish_splits``."""
    return torch.empty(split, tokens, rows, dtype=x.dtype if split == 1 else torch.float32, device=x.device)


def finish_splits(out: torch.Tensor, dtype: torch.dtype, unreduced: bool = False) -> torch.Tensor | SplitSums:
    """``split_output``'s buffer after the kernel -> ``[T, N]`` in ``dtype`` (the partial sums reduced), or with
    ``unreduced`` the partial sums as they are, for the caller's next op to add (``split_sums``)."""
    if out.shape[0] == 1:
        return out[0]
    return SplitSums(out, dtype) if unreduced else sum_splits(out, dtype)
