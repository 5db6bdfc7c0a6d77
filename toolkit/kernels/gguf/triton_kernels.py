"""Triton kernels over packed GGUF rows: dequantize, and fused dequantize-matmul.

The fused kernel computes ``out[T, N] = x[T, K] @ W[N, K].T`` without materialising W: each
program unpacks ``[BN, BK]`` weight tiles in registers, word-wise (``triton_words``, packed
column order, activations permuted to match) or element-wise (``triton_tiles``).

- ``BM == 1`` (one token, decode): multiply-accumulate in float32 registers, one reduction at
  the end; W stays float32, so this is the most accurate path too.
- ``BM >= 16`` (a few tokens, or prefill): the tile is cast to x's dtype and fed to ``tl.dot``
  with float32 accumulation.

A third grid axis splits K (``K_SPLIT`` columns per program) so that a decode-sized problem
still fills the GPU; partial sums then go to a float32 ``[SPLIT, T, N]`` buffer that the caller
reduces (deterministic, unlike atomics).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .triton_tiles import tile
from .triton_words import IQ4_NL, Q4_K, Q5_K, Q6_K, Q8_0, nibble32_tile, q6k_tile, q8_0_tile, q45k_tile


@triton.jit
def dequantize_kernel(w_ptr, out_ptr, table_ptr, N, K, row_bytes,
                      QTYPE: tl.constexpr, TS: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr,
                      BN: tl.constexpr, BK: tl.constexpr):
    offs_n = tl.program_id(0) * BN + tl.arange(0, BN)
    k0 = tl.program_id(1) * BK
    row_off = tl.minimum(offs_n, N - 1).to(tl.int64) * row_bytes
    w = tile(w_ptr, row_off, k0, table_ptr, QTYPE, TS, BLOCK, SUB, BN, BK)
    out = out_ptr + offs_n.to(tl.int64)[:, None] * K + (k0 + tl.arange(0, BK))[None, :]
    tl.store(out, w.to(out_ptr.dtype.element_ty), mask=(offs_n < N)[:, None])


@triton.jit
def _weights_and_x(w_ptr, row_off, k0, table_ptr, x_rows, x_mask, QTYPE: tl.constexpr, TS: tl.constexpr,
                   BLOCK: tl.constexpr, SUB: tl.constexpr, WORDS: tl.constexpr, BM: tl.constexpr,
                   BN: tl.constexpr, BK: tl.constexpr):
    """A weight tile and the activations of the same columns, in the same (packed) order."""
    if not WORDS:
        w = tile(w_ptr, row_off, k0, table_ptr, QTYPE, TS, BLOCK, SUB, BN, BK)
        x = tl.load(x_rows + k0 + tl.arange(0, BK)[None, :], mask=x_mask, other=0.0)
    elif QTYPE == Q8_0:
        w, x = q8_0_tile(w_ptr, row_off, k0, x_rows, x_mask, TS, BM, BN, BK)
    elif QTYPE == Q6_K:
        w, x = q6k_tile(w_ptr, row_off, k0, x_rows, x_mask, TS, BM, BN, BK)
    elif QTYPE == Q4_K or QTYPE == Q5_K:
        w, x = q45k_tile(w_ptr, row_off, k0, x_rows, x_mask, QTYPE, TS, BM, BN, BK)
    else:
        w, x = nibble32_tile(w_ptr, row_off, k0, x_rows, x_mask, table_ptr, QTYPE, TS, BM, BN, BK)
    return w, x


@triton.jit
def matmul_kernel(x_ptr, w_ptr, out_ptr, table_ptr, T, N, K_SPLIT, row_bytes, stride_x,
                  QTYPE: tl.constexpr, TS: tl.constexpr, BLOCK: tl.constexpr, SUB: tl.constexpr,
                  WORDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    row_off = tl.minimum(offs_n, N - 1).to(tl.int64) * row_bytes
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    x_rows = x_ptr + offs_m[:, None] * stride_x
    x_mask = offs_m[:, None] < T
    k_start = pid_k * K_SPLIT
    if BM == 1:
        acc_wide = tl.zeros((BN, BK), dtype=tl.float32)
        for k_step in range(0, K_SPLIT, BK):
            w, x = _weights_and_x(w_ptr, row_off, k_start + k_step, table_ptr, x_rows, x_mask,
                                  QTYPE, TS, BLOCK, SUB, WORDS, BM, BN, BK)
            acc_wide += tl.reshape(w * x.to(tl.float32), (BN, BK))
        acc = tl.sum(acc_wide, axis=1)[None, :]
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k_step in range(0, K_SPLIT, BK):
            w, x = _weights_and_x(w_ptr, row_off, k_start + k_step, table_ptr, x_rows, x_mask,
                                  QTYPE, TS, BLOCK, SUB, WORDS, BM, BN, BK)
            # both sides in the same column order, so the dot product is unchanged
            acc = tl.dot(tl.reshape(x, (BM, BK)), tl.trans(tl.reshape(w.to(x.dtype), (BN, BK))), acc)
    out = out_ptr + (pid_k * T + offs_m)[:, None] * N + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m < T)[:, None] & (offs_n < N)[None, :])
