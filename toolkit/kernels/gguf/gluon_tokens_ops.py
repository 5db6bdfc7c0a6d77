"""Host side of the 2-8-token Gluon GEMV on int8 tensor cores (``gluon_tokens_q4_0``: Q4_0): which calls it takes from
the token-unrolled dp4a GEMV (``triton_gemv_tokens``, through ``dp4a_ops``) and its launch.

A program is one warp over ``16 x tiles`` rows, one group of eight blocks (256 columns) per loop step; K is split
over the grid's second axis where the rows alone give too few programs (``split_k``).
"""
from __future__ import annotations

import functools
import os

import torch

from ..launch import launch_numbers, split_k
from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .gluon_ops import _runs_on

TYPES = frozenset({"Q4_0"})
MIN_TOKENS, MAX_TOKENS = 2, 8
GROUP_COLUMNS = 256               # a group of eight Q4_0 blocks: 144 bytes, nine 16-byte vectors
# (16-row tiles per program, programs per SM that K is split for (``split_k``)).
LAUNCH = (1, 8)
LAUNCH_NAMES = ("tiles", "programs_per_sm")
# Where it replaces the dp4a GEMV: (least tokens, least rows, least rows x columns, only when the caller takes split-K
# partial sums unreduced): taken where any holds. Session 27's H100 sweep (``.dev``: CUDA graphs over weight copies
# beyond L2, activations' blocks attached as the norms hand them), us, this kernel at ``LAUNCH`` / the dp4a GEMV, at
# 2, 4, 6, 8 tokens: 16384x2048 12.4 / 14.1, 14.2 / 18.0, 15.0 / 22.7, 16.4 / 23.1; 4096x14336 20.3 / 18.7, 22.0 /
# 33.0, 23.7 / 32.0, 25.2 / 32.1; 2048x8192 9.6 / 6.7, 10.2 / 8.7, 10.9 / 13.7, 11.8 / 14.1 (unreduced 7.3 / 6.7,
# 7.8 / 8.7, 8.5 / 13.7, 9.4 / 14.1); 3072x2048 4.8 / 4.3, 5.1 / 4.8, 5.5 / 5.7, 5.7 / 5.6; 2048x2048 unreduced 3.2 /
# 3.2, 3.5 / 3.6, 3.7 / 4.6, 3.9 / 4.6 (reduced at 6 and 8 tokens 5.8 / 4.6: the second launch that sums eight
# splits of one group each). A second sweep through bench/bench_gguf_kernels.py (activations rounded inside both)
# gave the same picture, 4096x14336 at 4 tokens 23.9 / 34.8. Up to 4 tokens the MMA's eight token columns are mostly
# idle; the dp4a GEMV unrolls tokens to a power of two, so from 5 it does the work of 8.
RULES = ((2, 8192, 0, False), (5, 0, 1 << 24, False), (4, 0, 1 << 25, False), (4, 0, 1 << 24, True), (5, 0, 0, True))


def tokens_launch(name: str, data: torch.Tensor, cols: int, tokens: int,
                  unreduced: bool = False) -> tuple[int, int] | None:
    """The launch (``LAUNCH``'s form) for ``tokens`` tokens of type ``name`` on ``data``, or None (the dp4a GEMV): a
    type of ``TYPES``, 2-8 tokens, a shape and token count ``RULES`` take (``unreduced``: the caller takes split-K
    partial sums), rows of whole groups on 16-byte boundaries, a Gluon-capable device, not turned off
    (``TOOLKIT_GGUF_GLUON_TOKENS=0``). ``TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH=tiles,programs_per_sm`` sets the launch and
    takes every 2-8-token call (benchmarks)."""
    if (name not in TYPES or not MIN_TOKENS <= tokens <= MAX_TOKENS
            or os.environ.get("TOOLKIT_GGUF_GLUON_TOKENS", "1") == "0" or not _runs_on(data.device, _tokens_kernel)
            or cols % GROUP_COLUMNS or data.stride(0) % 16 or data.data_ptr() % 16):
        return None
    forced = os.environ.get("TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH")
    if forced:
        return tuple(launch_numbers("TOOLKIT_GGUF_GLUON_TOKENS_LAUNCH", forced, LAUNCH_NAMES).values())
    rows = data.shape[0]
    taken = any(tokens >= least_tokens and rows >= least_rows and rows * cols >= least_size and (unreduced or not only)
                for least_tokens, least_rows, least_size, only in RULES)
    return LAUNCH if taken else None


@functools.lru_cache(maxsize=None)
def _tokens_kernel():
    """The 2-8-token Q4_0 kernel, or None where this Triton has no Gluon (imported at the first call it could take)."""
    try:  # noqa: PLC0415 - Gluon only on the GPUs that run it
        from .gluon_tokens_q4_0 import gluon_tokens_q4_0_kernel
    except ImportError:
        return None
    return gluon_tokens_q4_0_kernel


def gluon_tokens(words: torch.Tensor, scales: torch.Tensor, data: torch.Tensor, cols: int, x: torch.Tensor,
                 launch: tuple[int, int], unreduced: bool = False) -> torch.Tensor:
    """``x [T, cols] @ W.T`` for a Q4_0 weight ``data [rows, row bytes]`` from x's int8 blocks (``words [T, cols / 4]``,
    ``scales [T, cols / 32]``: ``dp4a_ops.activation_blocks``) with ``launch`` (``tokens_launch``'s); ``[T, rows]`` in
    x's dtype, or its split-K partial sums with ``unreduced`` (``triton_reduce.finish_splits``)."""
    tiles, programs_per_sm = launch
    tokens, rows = x.shape[0], data.shape[0]
    programs = -(-rows // (16 * tiles))
    split = split_k(programs, cols // GROUP_COLUMNS, x.device, programs_per_sm=programs_per_sm)
    out = split_output(split, tokens, rows, x)
    _tokens_kernel()[(programs, split)](
        words, scales, data, out, tokens, rows, cols // split, data.stride(0), words.stride(0), scales.stride(0),
        TILES=tiles, num_warps=1, **launch_options(x.device))
    return finish_splits(out, x.dtype, unreduced)
