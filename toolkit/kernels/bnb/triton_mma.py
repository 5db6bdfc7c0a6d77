"""Tensor-core kernels for bitsandbytes weights and 2 to 16 tokens: ``out[T, N] = x[T, K] @ W[N, K].T``
computed as ``W_tile @ x_tile.T`` so that the weight is ``tl.dot``'s first operand.

Why this order: on sm_90 the first operand of a warpgroup MMA may come from registers, the second must
sit in shared memory. The first bitsandbytes kernels (``triton_kernels``) fed the decoded weight as the
second operand (``x @ W.T``), so every decoded tile took a trip through shared memory, and their columns
were permuted into a packed order the activations then had to follow; they lost to bitsandbytes'
dequantize + cuBLAS at 8 tokens. Here each weight is decoded in registers in the layout the MMA reads
(every decoding step is element-wise, so Triton loads the packed bytes straight in that layout), and only
the few activations (16 padded tokens x the step's columns) go through shared memory.

4-bit (bitsandbytes' ``quantize_4bit`` layout, NF4 or FP4): byte ``j`` of a row holds column ``2j`` in its
high nibble and ``2j + 1`` in its low one, so a chunk of ``CHUNK`` columns (inside one absmax block) is two
dots of ``CHUNK / 2`` columns: high nibbles against the even columns of x, low nibbles against the odd ones.
A nibble becomes its codebook value rounded to x's dtype (on the GPU by the PTX of ``mma_ops.decode_asm``,
byte permutes on the codebook held in registers; under the interpreter by codebook loads), and the chunk's
float32 sums are scaled by its absmax (double quantization: ``absmax = code2[absmax_u8] * absmax2 +
offset``, as ``dequantize_4bit`` has it). bitsandbytes rounds ``code * absmax`` instead; the rounding is the
same relative size. Fused projections (q/k/v, gate/up) run in one launch as in ``triton_gemv_tokens``
(``NSEG`` segments, statistics back to back; ``_segments`` says which).

int8 (``Int8Params``: ``CB [N, K]``, ``SCB [N]``): weight-only, as ``triton_kernels``: int8 values are
exact in fp16/bf16, the float32 sums are scaled by ``SCB / 127`` per row at the end.

Grid: (row tiles of ``BN``, K splits); every program covers all ``T <= BM = 16`` tokens (padding tokens
read zeros and are never stored). Split K writes float32 partial sums ``[SPLIT, T, N]`` the caller
reduces. ``PDL``: the kernel waits for the previous one before anything (``kernels/triton_pdl.py``).
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_pdl import wait_for_previous
from .triton_gemv_tokens import _segments


@triton.jit
def _block_scale(absmax_ptr, code2_ptr, absmax2_ptr, offset_ptr, block, seg, a_start, b_start,
                 NB2: tl.constexpr, NESTED: tl.constexpr):
    """``[BN, 1]`` float32: each row's absmax of ``block`` (flat block index), as ``dequantize_4bit`` has it."""
    if NESTED:
        code2 = tl.load(code2_ptr + seg * 256 + tl.load(absmax_ptr + block).to(tl.int32))
        return code2 * tl.load(absmax2_ptr + a_start + (block - b_start) // NB2) + tl.load(offset_ptr + seg)
    else:
        return tl.load(absmax_ptr + block)


@triton.jit
def _activations(x_ptr, tokens, T, stride_x, first_col, COLS: tl.constexpr):
    """``[COLS, BM]``: columns ``first_col ..`` of x for each token (zeros past ``T``)."""
    cols = first_col + tl.arange(0, COLS)[:, None]
    return tl.load(x_ptr + tokens[None, :] * stride_x + cols, mask=tokens[None, :] < T, other=0.0)


@triton.jit
def _even_odd_activations(x_ptr, tokens, T, stride_x, first_col, COLS: tl.constexpr):
    """``[COLS / 2, BM]`` twice: the even and the odd columns of ``first_col ..`` (zeros past ``T``), loaded
    as whole rows (a contiguous load the pipeliner can stage) and split in registers."""
    x = tl.load(x_ptr + tokens[:, None] * stride_x + first_col + tl.arange(0, COLS)[None, :],
                mask=tokens[:, None] < T, other=0.0)
    even, odd = tl.split(tl.reshape(x, (tokens.shape[0], COLS // 2, 2)))
    return tl.trans(even), tl.trans(odd)


@triton.jit
def _store_transposed(out_ptr, acc, tokens, offs_n, T, N, pid_k):
    """``acc [BN, BM]`` -> ``out[pid_k, t, n]``."""
    out = out_ptr + (pid_k * T + tokens[None, :]).to(tl.int64) * N + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(tokens[None, :] < T) & (offs_n[:, None] < N))


@triton.jit
def _nibble_codes(packed, code_rows, x_ptr, DECODE: tl.constexpr):
    """``packed [BN, HALF]`` bytes -> the codebook values of their high and low nibbles in x's dtype:
    by ``DECODE`` (PTX from ``decode_asm``: byte permutes on the codebook held in registers), or, where it
    is empty (the interpreter), by loads from the segments' codebooks."""
    dtype = x_ptr.dtype.element_ty
    if DECODE == "":
        high = tl.load(code_rows + (packed.to(tl.int32) >> 4)).to(dtype)
        low = tl.load(code_rows + (packed.to(tl.int32) & 15)).to(dtype)
    else:
        high, low = tl.inline_asm_elementwise(DECODE, "=r,=r,=r,=r,r", [packed], dtype=(dtype, dtype),
                                              is_pure=True, pack=4)
    return high, low


@triton.jit
def fourbit_mma_kernel(x_ptr, w_ptr, absmax_ptr, code_ptr, code2_ptr, absmax2_ptr, offset_ptr, out_ptr,
                       T, N, K, K_SPLIT, stride_x, R1, R2, R3, A1, A2, A3, B1, B2, B3,
                       BS: tl.constexpr, NB2: tl.constexpr, NESTED: tl.constexpr, NSEG: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, CHUNK: tl.constexpr, CHUNKS: tl.constexpr,
                       DECODE: tl.constexpr = "", PDL: tl.constexpr = False):
    """``out[pid_k, t, n]``, ``BN`` rows per program, ``CHUNKS`` chunks of ``CHUNK`` columns per K step (a
    chunk lies in one absmax block of ``BS`` columns: ``CHUNK`` divides ``BS``); ``code_ptr``: each segment's
    16-entry float32 codebook back to back (read without ``DECODE``, which holds the one codebook of every
    segment), ``code2_ptr`` their nested 256-entry ones, ``offset_ptr`` their offsets (``K_SPLIT`` a
    multiple of ``CHUNKS * CHUNK``)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)[:, None]       # tail rows re-read the last one, never stored
    seg, a_start, b_start = _segments(rows, R1, R2, R3, A1, A2, A3, B1, B2, B3, NSEG)
    code_rows = code_ptr + seg * 16
    HALF: tl.constexpr = CHUNK // 2
    w_rows = w_ptr + rows * (K // 2) + tl.arange(0, HALF)[None, :]                            # [BN, HALF]
    tokens = tl.arange(0, BM)
    wait_for_previous(PDL, LAUNCH_NEXT=False)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    k_start = pid_k * K_SPLIT
    for k_step in range(0, K_SPLIT, CHUNKS * CHUNK):
        for c in tl.static_range(CHUNKS):
            k0 = k_start + k_step + c * CHUNK
            # the chunk's absmax scales its sums (bitsandbytes scales each weight before rounding it; scaling the
            # codes first, in x's dtype, ran 5-40% slower at 8 tokens on an H100); loaded first, so that its
            # latency passes during the decoding and the dots
            scale = _block_scale(absmax_ptr, code2_ptr, absmax2_ptr, offset_ptr, rows * (K // BS) + k0 // BS,
                                 seg, a_start, b_start, NB2, NESTED)
            high, low = _nibble_codes(tl.load(w_rows + k0 // 2), code_rows, x_ptr, DECODE)
            even, odd = _even_odd_activations(x_ptr, tokens, T, stride_x, k0, CHUNK)
            acc += tl.dot(low, odd, tl.dot(high, even)) * scale
    _store_transposed(out_ptr, acc, tokens, offs_n, T, N, pid_k)


@triton.jit
def int8_mma_kernel(x_ptr, w_ptr, scb_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, stride_w,
                    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PDL: tl.constexpr = False):
    """``out[pid_k, t, n]``, ``BN`` rows per program, ``BK`` columns per K step; ``stride_w``: bytes
    between rows (``K_SPLIT`` a multiple of ``BK``)."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    w_rows = w_ptr + rows[:, None] * stride_w + tl.arange(0, BK)[None, :]                       # [BN, BK]
    tokens = tl.arange(0, BM)
    wait_for_previous(PDL, LAUNCH_NEXT=False)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    k_start = pid_k * K_SPLIT
    for k_step in range(0, K_SPLIT, BK):
        k0 = k_start + k_step
        w = tl.load(w_rows + k0).to(x_ptr.dtype.element_ty)          # int8 values are exact in fp16 and bf16
        acc = tl.dot(w, _activations(x_ptr, tokens, T, stride_x, k0, BK), acc)
    scale = tl.load(scb_ptr + rows) * (1.0 / 127.0)
    _store_transposed(out_ptr, acc * scale[:, None], tokens, offs_n, T, N, pid_k)
