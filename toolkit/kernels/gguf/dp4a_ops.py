"""Host side of the int8-activation dp4a GEMV (``triton_gemv_tokens``, 1-8 tokens): the activations' int8
blocks (the ones a producer attached, ``int8_blocks``, else rounded here by ``triton_dp4a``'s quantize kernel)
and the GEMV's launch (``gemv_launch.tokens_config``). ``gguf_matmul`` (``triton_ops``) decides which calls
take it; the int8 tensor-core kernel (``triton_ops.mmq_matmul``) and the MoE kernels read the same blocks.
"""
from __future__ import annotations

import os

import torch
import triton

from . import gluon_gemv_ops, gluon_tokens_ops
from .gemv_launch import DP4A_STEP, TOKENS_SUM_TYPES, WEIGHT_EVICTION, GemvConfig, eviction, tokens_config
from .triton_dp4a import quantize_activations_kernel
from .triton_gemv_tokens import gemv_tokens_kernel
from .types import type_name, type_size
from ..int8_blocks import Int8Blocks, attached
from ..launch import split_k, tile_width as _tile_width
from ..sibling_launches import in_siblings
from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output

# The Triton interpreter (TRITON_INTERPRET=1, CPU) cannot run PTX: the kernels then compute the
# same integer sums with shifts.
_HARDWARE_DP4A = os.environ.get("TRITON_INTERPRET") != "1"


def dp4a_enabled() -> bool:
    return os.environ.get("TOOLKIT_GGUF_DP4A", "1") != "0"


def activation_blocks(x: torch.Tensor, sums: bool) -> Int8Blocks:
    """``x``'s int8 blocks: the ones its producer attached (``int8_blocks``) when they serve, else rounded here.

    Never attached here: x may be a buffer that kernels rewrite without a version bump (a CUDA graph's static
    output replays into the same tensor object), where blocks kept on it would go stale unseen. A producer's
    output is a fresh tensor its kernel just wrote."""
    blocks = attached(x, sums)
    if blocks is None:
        words, scales, *block_sums = quantize_activations(x, sums=sums)
        blocks = Int8Blocks(words, scales, block_sums[0] if sums else None)
    return blocks


def quantize_activations(x: torch.Tensor, sums: bool = False):
    """``x [T, K]`` -> int8 blocks of 32 packed 4 to an int32 ``[T, K / 4]``, float32 scales ``[T, K / 32]``,
    and with ``sums`` also ``d * sum(q)`` per block ``[T, K / 32]`` (float32; Q4_K's minimum term)."""
    tokens, cols = x.shape
    words = torch.empty(tokens, cols // 4, dtype=torch.int32, device=x.device)
    scales = torch.empty(tokens, cols // 32, dtype=torch.float32, device=x.device)
    block_sums = torch.empty_like(scales) if sums else scales
    bk = _tile_width(cols, 512)
    quantize_activations_kernel[(tokens, cols // bk)](x, words, scales, block_sums, cols, x.stride(0), BK=bk,
                                                      SUMS=sums, **launch_options(x.device))
    return (words, scales, block_sums) if sums else (words, scales)


def dp4a_tokens_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int,
                       config: GemvConfig | None = None, unreduced: bool = False) -> torch.Tensor:
    """``x [T, cols] @ W.T`` for ``T <= 8`` with the token-unrolled dp4a GEMV (``triton_gemv_tokens``):
    each program reads ``BN`` rows once for all T tokens; ``[T, rows]`` in x's dtype. Without a ``config``, one
    token goes to the Gluon GEMV where ``gluon_gemv_ops.gemv_launch`` takes it, 2-8 tokens to the Gluon tensor-core GEMV
    where ``gluon_tokens_ops.tokens_launch`` does. ``config.bm`` is
    ignored (the kernel unrolls T rounded up to a power of two). ``unreduced``: split-K partial sums returned as
    they are (``triton_reduce.finish_splits``)."""
    name = type_name(qtype)
    tokens, rows, step = x.shape[0], data.shape[0], DP4A_STEP[name]
    chosen, config = config is None, config or tokens_config(name, tokens, rows, cols)
    blocks = attached(x, name in TOKENS_SUM_TYPES)
    # a sibling launch may wait late only on blocks that existed before the first sibling (not rounded here)
    late = tokens == 1 and blocks is not None and in_siblings()
    if blocks is None:
        blocks = activation_blocks(x, sums=name in TOKENS_SUM_TYPES)
    words, scales, sums = blocks.words, blocks.scales, blocks.sums if name in TOKENS_SUM_TYPES else None
    launch = gluon_gemv_ops.gemv_launch(name, data, cols, words, scales, *([] if sums is None else [sums])) \
        if tokens == 1 and chosen else None
    if launch is not None:                      # one token, a launch not given: the Gluon GEMV where it serves
        return gluon_gemv_ops.gluon_gemv(name, words, scales, sums, data, cols, x, launch, config.split, unreduced)
    tokens_launch = gluon_tokens_ops.tokens_launch(name, data, cols, tokens, unreduced) if chosen else None
    if tokens_launch is not None:               # 2-8 tokens of Q4_0: the tensor-core GEMV where it serves
        return gluon_tokens_ops.gluon_tokens(words, scales, data, cols, x, tokens_launch, unreduced)
    grid_n = triton.cdiv(rows, config.bn)
    split = config.split or split_k(grid_n, cols // _tile_width(cols, max(config.bk, step)), x.device)
    while split > 1 and (cols % split or (cols // split) % step):  # each split: whole blocks
        split -= 1
    bk = _tile_width(cols // split, max(config.bk, step))
    out = split_output(split, tokens, rows, x)
    gemv_tokens_kernel[(grid_n, split)](
        words, scales, scales if sums is None else sums, data, out, tokens, rows, cols, cols // split,
        data.stride(0), QTYPE=int(qtype), TS=type_size(qtype), BM=triton.next_power_of_2(tokens), BN=config.bn,
        BK=bk, DP4A=_HARDWARE_DP4A, EVICT=eviction(WEIGHT_EVICTION, name), num_warps=config.num_warps,
        num_stages=config.num_stages, LATE_WAIT=late, **launch_options(x.device))
    return finish_splits(out, x.dtype, unreduced)


def _dp4a_ok(data: torch.Tensor, qtype: int, cols: int) -> bool:
    name = type_name(qtype)
    # K-quant tiles of Q4_K/Q5_K read 32-bit words: rows must stay 4-aligned
    return (name in DP4A_STEP and cols % DP4A_STEP[name] == 0 and dp4a_enabled()
            and (name not in ("Q4_K", "Q5_K") or data.stride(0) % 4 == 0))
