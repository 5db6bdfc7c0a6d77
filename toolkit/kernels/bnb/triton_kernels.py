"""Triton kernels for bitsandbytes weights at small batches: ``out[T, N] = x[T, K] @ W[N, K].T``
straight from the packed weights, never materialising W.

4-bit (NF4/FP4, bitsandbytes' ``quantize_4bit`` layout): byte ``j`` of the flat row-major weight
holds element ``2j`` in its high nibble and ``2j + 1`` in its low nibble; element ``e`` is
``code[nibble] * absmax[e // blocksize]``. With double quantization (``compress_statistics``) the
absmax itself is ``code2[absmax_u8[b]] * absmax2[b // blocksize2] + offset``, computed here per
(row, block) exactly as bitsandbytes' ``dequantize_4bit`` does before it dequantizes.

int8 (``Int8Params``: ``CB [N, K]`` int8, ``SCB [N]`` float32): ``W = CB * SCB / 127``; the sum over
K runs on the int8 values, the row scale multiplies the result (weight-only: activations stay float).

Tiles are read a 32-bit word at a time (4 bytes = 8 nibbles or 4 int8), each bit field turned into
a float in the thread's own registers (``tl.join`` appends a register-minor dimension), and the
activations of the same columns are loaded in natural order and permuted to the packed order: a
dot product does not depend on the order of its terms (the style of ``kernels/gguf/triton_words``).

- ``BM == 1`` (decode): float32 multiply-accumulate, one reduction at the end; W stays float32.
- ``BM >= 16`` with ``DOT`` (2..16 tokens): W's tile is cast to x's dtype (for 4-bit that is
  bitsandbytes' own rounding of the dequantized weight) and fed to ``tl.dot``, float32 accumulation.
- ``BM > 1`` without ``DOT``: float32 multiply-accumulate of every token against the float32 tile,
  reduced per K step (an alternative for a few tokens, timed by the bench's sweep).

A third grid axis splits K (``K_SPLIT`` columns per program) so a small projection still fills the
GPU; partial sums go to a float32 ``[SPLIT, T, N]`` buffer the caller reduces (deterministic).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _exact_float(v):
    """float32 of an integer 0 <= v < 2**23 with ALU ops only (v OR'd into 2**23's mantissa)."""
    return (v.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _join4(v0, v1, v2, v3):
    """``[..., 2, 2]`` with ``[..., a, c] = v[a + 2c]``."""
    return tl.join(tl.join(v0, v1), tl.join(v2, v3))


@triton.jit
def _store(out_ptr, acc, offs_m, offs_n, T, N, pid_k):
    out = out_ptr + pid_k.to(tl.int64) * T * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < T) & (offs_n[None, :] < N))


@triton.jit
def _fma_tokens(w, x, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """``[BM, BN]`` partial sums of a few tokens in float32 FMAs (no tensor cores): each unpacked
    weight serves BM tokens, so for T <= 8 or so the unpacking, not the arithmetic, should bound it."""
    return tl.sum(tl.reshape(w[None] * x.to(tl.float32)[:, None], (BM, BN, BK)), axis=2)


@triton.jit
def _nibble_tile(w_words, absmax_ptr, code_ptr, code2_ptr, absmax2_ptr, offset_ptr, rows, k0, K,
                 BS: tl.constexpr, GW: tl.constexpr, NB2: tl.constexpr, NESTED: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr):
    """Weights ``[BN, G, W, 2 (h), 2 (b0), 2 (b1)]``: nibble ``h`` (0: high) of byte ``b0 + 2 b1``
    of word ``w`` of group ``g`` (``GW`` columns, inside one absmax block), float32."""
    G: tl.constexpr = BK // GW
    WPG: tl.constexpr = GW // 8
    g = tl.arange(0, G)[None, :, None]
    col = k0 + g * GW                                                                  # [1, G, 1]
    words = tl.load(w_words + rows[:, None, None] * (K // 8) + col // 8 + tl.arange(0, WPG)[None, None, :])
    block = rows[:, None, None] * (K // BS) + col // BS                               # [BN, G, 1]
    if NESTED:
        scale = tl.load(code2_ptr + tl.load(absmax_ptr + block).to(tl.int32)) * tl.load(absmax2_ptr + block // NB2)
        scale = scale + tl.load(offset_ptr)
    else:
        scale = tl.load(absmax_ptr + block)
    v = _join4(tl.join(tl.load(code_ptr + ((words >> 4) & 15)), tl.load(code_ptr + (words & 15))),
               tl.join(tl.load(code_ptr + ((words >> 12) & 15)), tl.load(code_ptr + ((words >> 8) & 15))),
               tl.join(tl.load(code_ptr + ((words >> 20) & 15)), tl.load(code_ptr + ((words >> 16) & 15))),
               tl.join(tl.load(code_ptr + ((words >> 28) & 15)), tl.load(code_ptr + ((words >> 24) & 15))))
    return v * scale[:, :, :, None, None, None]


@triton.jit
def nf4_matmul_kernel(x_ptr, w_ptr, absmax_ptr, code_ptr, code2_ptr, absmax2_ptr, offset_ptr, out_ptr,
                      T, N, K, K_SPLIT, stride_x,
                      BS: tl.constexpr, GW: tl.constexpr, NB2: tl.constexpr, NESTED: tl.constexpr,
                      BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)                  # tail rows re-read the last one, never stored
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    x_rows = x_ptr + offs_m[:, None] * stride_x
    x_mask = offs_m[:, None] < T
    w_words = w_ptr.to(tl.pointer_type(tl.uint32))
    G: tl.constexpr = BK // GW
    WPG: tl.constexpr = GW // 8
    k_start = pid_k * K_SPLIT
    if BM == 1:
        acc_wide = tl.zeros((BN, G, WPG, 2, 2, 2), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k_step in range(0, K_SPLIT, BK):
        k0 = k_start + k_step
        w = _nibble_tile(w_words, absmax_ptr, code_ptr, code2_ptr, absmax2_ptr, offset_ptr, rows, k0, K,
                         BS, GW, NB2, NESTED, BN, BK)
        x = tl.load(x_rows + k0 + tl.arange(0, BK)[None, :], mask=x_mask, other=0.0)
        x = tl.permute(tl.reshape(x, (BM, G, WPG, 2, 2, 2)), (0, 1, 2, 5, 4, 3))   # [m, g, w, h, b0, b1]
        if BM == 1:
            acc_wide += w * x.to(tl.float32)
        elif DOT:
            acc = tl.dot(tl.reshape(x, (BM, BK)), tl.trans(tl.reshape(w.to(x.dtype), (BN, BK))), acc)
        else:
            acc += _fma_tokens(w, x, BM, BN, BK)
    if BM == 1:
        acc = tl.sum(tl.reshape(acc_wide, (BN, BK)), axis=1)[None, :]
    _store(out_ptr, acc, offs_m, offs_n, T, N, pid_k)


@triton.jit
def int8_matmul_kernel(x_ptr, w_ptr, scb_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, stride_w,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DOT: tl.constexpr):
    """``stride_w``: bytes between rows (a multiple of 4)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = tl.minimum(offs_n, N - 1).to(tl.int64)
    offs_m = (pid_m * BM + tl.arange(0, BM)).to(tl.int64)
    x_rows = x_ptr + offs_m[:, None] * stride_x
    x_mask = offs_m[:, None] < T
    w_words = w_ptr.to(tl.pointer_type(tl.uint32)) + rows[:, None] * (stride_w // 4)
    WPS: tl.constexpr = BK // 4
    k_start = pid_k * K_SPLIT
    if BM == 1:
        acc_wide = tl.zeros((BN, WPS, 2, 2), dtype=tl.float32)
    else:
        acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k_step in range(0, K_SPLIT, BK):
        k0 = k_start + k_step
        words = tl.load(w_words + k0 // 4 + tl.arange(0, WPS)[None, :])                 # [BN, WPS]
        # byte i as a signed value: offset binary (b ^ 128) - 128, exact in float32
        w = _join4(_exact_float((words & 255) ^ 128), _exact_float(((words >> 8) & 255) ^ 128),
                   _exact_float(((words >> 16) & 255) ^ 128), _exact_float((words >> 24) ^ 128)) - 128.0
        x = tl.load(x_rows + k0 + tl.arange(0, BK)[None, :], mask=x_mask, other=0.0)
        x = tl.permute(tl.reshape(x, (BM, WPS, 2, 2)), (0, 1, 3, 2))                       # [m, w, b0, b1]
        if BM == 1:
            acc_wide += w * x.to(tl.float32)
        elif DOT:  # int8 values are exact in fp16 and bf16
            acc = tl.dot(tl.reshape(x, (BM, BK)), tl.trans(tl.reshape(w.to(x.dtype), (BN, BK))), acc)
        else:
            acc += _fma_tokens(w, x, BM, BN, BK)
    if BM == 1:
        acc = tl.sum(tl.reshape(acc_wide, (BN, BK)), axis=1)[None, :]
    scale = tl.load(scb_ptr + rows) * (1.0 / 127.0)
    _store(out_ptr, acc * scale[None, :], offs_m, offs_n, T, N, pid_k)
