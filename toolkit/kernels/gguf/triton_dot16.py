"""GGUF matmul for 17 to 64 tokens on 16-bit tensor cores: each weight decoded once, in registers, to x's
dtype and fed as the first operand of ``tl.dot`` against the activations: ``out[T, N] = x[T, K] @ W[N, K].T``
computed as ``W_tile @ x_tile.T``.

Why: above 16 tokens the int8 kernel (``triton_mmq``) pays a float multiply-add per 32 columns, token and row,
so its work per weight grows with the tokens, and dequantize + cuBLAS writes and re-reads the whole weight in 16
bits on every step (the 8B's batches 32-64 ran at 0.86-0.91x llama.cpp with them). Here a weight costs the same
few instructions whatever the tokens: its quant unpacked (``triton_mmq.nibbles`` / ``six_bits``: a shift and
a mask per four weights), turned to float32, one multiply-add with its sub-block's scale (and minimum), rounded
to x's dtype. On sm_90 the first operand of a warpgroup MMA is read from registers, so the decoded weights
never go through shared memory; the packed bytes and the activations do (staged by Triton's pipeliner).

The weight is rounded to x's dtype once (bf16: relative 2^-9), where the int8 kernels round the activations
to 8 bits (2^-8 per 32-block); the tests hold it to gguf-py's dequantization times x.

Types: Q4_K (super-blocks of 256: 32-column sub-blocks with a 6-bit scale and minimum; a 32-byte load serves
the low nibbles of one sub-block and the high nibbles of the next) and Q6_K (sixteen 16-column scales: a
32-column piece takes its two scales by column). K may be split over a third grid axis (``K_SPLIT`` columns,
whole super-blocks); partial sums then go to a float32 ``[SPLIT, T, N]`` buffer the caller reduces.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_pdl import wait_for_previous
from .triton_mmq import ASM, _k_scale_min_words, nibbles, six_bits
from .triton_words import Q4_K, _u16, _u32, half_bits


@triton.jit
def _activations(x_ptr, tokens, T, stride_x, first_col):
    """``[32, BM]``: columns ``first_col ..`` of x for each token (zeros past ``T``)."""
    cols = first_col + tl.arange(0, 32)[:, None]
    return tl.load(x_ptr + tokens[None, :] * stride_x + cols, mask=tokens[None, :] < T, other=0.0)


@triton.jit
def _weights(q, scale, offset, x_ptr):
    """``q * scale - offset`` in float32 (q int8), rounded to x's dtype: the MMA's first operand."""
    return (q.to(tl.float32) * scale - offset).to(x_ptr.dtype.element_ty)


@triton.jit
def dot16_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                 QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 PDL: tl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns.
    ``row_bytes``: bytes between weight rows (4-aligned for Q4_K's scale words, 2 for Q6_K)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * row_bytes   # [BN, 1]; tail rows never stored
    tokens = pid_m * BM + tl.arange(0, BM)
    c = tl.arange(0, 32)[None, :]
    wait_for_previous(PDL, LAUNCH_NEXT=False)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    first = pid_k * (K_SPLIT // 256)
    for sb in range(first, first + K_SPLIT // 256):
        block = rows + sb * TS
        k0 = sb * 256
        if QTYPE == Q4_K:  # d, dmin, scales[12], qs[128]: 32-column sub-block s is nibble s % 2 of bytes 32 (s // 2)..
            d = half_bits(_u16(block, 0))
            dmin = half_bits(_u16(block, 1))
            sw0, sw1, sw2 = _u32(block + 4, 0), _u32(block + 4, 1), _u32(block + 4, 2)
            for s in tl.static_range(8):
                if s % 2 == 0:
                    byte = tl.load(block + 16 + 16 * s + c)                                 # [BN, 32]
                sc, mn = _k_scale_min_words(sw0, sw1, sw2, s)
                w = _weights(nibbles(byte, 4 * (s % 2), ASM), d * sc, dmin * mn, x_ptr)
                acc = tl.dot(w, _activations(x_ptr, tokens, T, stride_x, k0 + 32 * s), acc)
        else:  # Q6_K: ql[128], qh[64], scales[16] int8, d; 32-column piece s = quarter s % 4 of half s // 4
            d = half_bits(_u16(block, 104))
            for s in tl.static_range(8):
                if s % 4 == 0:  # quarters 0 and 2 share ql bytes 0..31 of the half, 1 and 3 bytes 32..63
                    ql_even = tl.load(block + 64 * (s // 4) + c)
                    ql_odd = tl.load(block + 64 * (s // 4) + 32 + c)
                    qh = tl.load(block + 128 + 32 * (s // 4) + c)
                if s % 2 == 0:
                    q = six_bits(ql_even, qh, s % 4, ASM)                                  # q - 32, int8
                else:
                    q = six_bits(ql_odd, qh, s % 4, ASM)
                sc_low = tl.load(block + 192 + 2 * s).to(tl.int8, bitcast=True).to(tl.float32)
                sc_high = tl.load(block + 193 + 2 * s).to(tl.int8, bitcast=True).to(tl.float32)
                w = _weights(q, d * tl.where(c < 16, sc_low, sc_high), 0.0, x_ptr)
                acc = tl.dot(w, _activations(x_ptr, tokens, T, stride_x, k0 + 32 * s), acc)
    out = out_ptr + (pid_k * T + tokens[None, :]).to(tl.int64) * N + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(tokens[None, :] < T) & (offs_n[:, None] < N))
