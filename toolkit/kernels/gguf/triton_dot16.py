"""GGUF matmul for 17 to 64 tokens on 16-bit tensor cores: each weight decoded once, in registers, to x's
dtype and fed as the first operand of ``tl.dot`` against the activations: ``out[T, N] = x[T, K] @ W[N, K].T``
computed as ``W_tile @ x_tile.T``.

Why: above 16 tokens the int8 kernel (``triton_mmq``) pays a float multiply-add per 32 columns, token and row,
so its work per weight grows with the tokens, and dequantize + cuBLAS writes and re-reads the whole weight in 16
bits on every step (the 8B's batches 32-64 ran at 0.86-0.91x llama.cpp with them). Here a weight costs the same
few instructions whatever the tokens. On sm_90 the first operand of a warpgroup MMA is read from registers, so
where the packed bytes are 4-byte aligned (Q4_K) the decoded weights never go through shared memory; the packed
bytes and the activations do (staged by Triton's pipeliner).

Decoding a weight: its quant unpacked four to a register (``triton_mmq.nibbles`` / ``six_bits``), then, for
Q4_0, Q8_0 and Q4_K, made a float without an int->float conversion (those run at a quarter of the FP32 rate on
Hopper, and were one per weight): ``unit_floats`` puts the byte into the mantissa of 1.0 (``1 + q / 128``
exactly, one byte permute), and one fused multiply-add per weight takes it to ``q * scale - offset``:
``u * 128 scale - (128 scale + offset)``, the per-row constants computed once per sub-block. Q8_0's full signed
bytes go one byte lower (``byte_floats``: ``1 + (q + 128) / 32768``). The fused multiply-add is exact up to its
one rounding for Q4_0 and Q8_0; Q4_K's ``128 scale + offset`` may round (2^-24 of it, ~2^-17 of the sub-block's
scale). Q6_K keeps the int8 conversion (the float-building form measured 10-20% slower there; reading pairs of
its 2-aligned super-blocks as 32-bit words, so that the pipeliner stages every load, was 1.3-2x slower still:
docs/benchmarks.md, run 20). The weight is then rounded to x's dtype once (bf16: relative 2^-9), where the
int8 kernels round the activations to 8 bits (2^-8 per 32-block); the tests hold it to gguf-py's
dequantization times x.

Types and their K loops:
- Q4_K (super-blocks of 256: 32-column sub-blocks with a 6-bit scale and minimum; a 32-byte load serves the low
  nibbles of one sub-block and the high nibbles of the next; d and dmin read as one 32-bit word, so that the
  pipeliner stages it with the rest) and Q6_K (sixteen 16-column scales: a 32-column piece takes its two
  scales by column): one super-block per iteration, a dot per 32 columns.
- Q4_0 and Q8_0 (18- and 34-byte blocks of 32 columns, one fp16 scale): ``GROUP`` blocks per iteration, a dot
  each. Their blocks are only 2-byte aligned, which the pipeliner's asynchronous copies cannot stage, so their
  loads stay in the loop (and the decoded tile reaches the MMA through shared memory). Q4_0's column c is
  nibble c // 16 of byte c % 16.
K may be split over a third grid axis (``K_SPLIT`` columns, whole super-blocks); partial sums then go to a
float32 ``[SPLIT, T, N]`` buffer the caller reduces.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_pdl import wait_for_previous
from .triton_mmq import ASM, _k_scale_min_words, nibbles, six_bits
from .triton_words import Q4_0, Q4_K, Q6_K, _u16, _u32, half_bits


# The PTX of ``unit_floats`` and ``byte_floats`` (pack 4: input ``$4``, four bytes; outputs ``$0..$3``, one float
# each). prmt's selector picks, per output byte, a byte of {m, t} (t: 0-3, m: 4-7): 0x7044 + 0x100 i is
# (m0, m0, t_i, m3), 0x7604 + 0x10 i is (m0, t_i, m2, m3).
UNIT_FLOATS_PTX = tl.constexpr(
    "{ .reg .b32 t, m; or.b32 t, $4, 0x80808080; mov.b32 m, 0x3F000000; prmt.b32 $0, t, m, 0x7044; "
    "prmt.b32 $1, t, m, 0x7144; prmt.b32 $2, t, m, 0x7244; prmt.b32 $3, t, m, 0x7344; }")
BYTE_FLOATS_PTX = tl.constexpr(
    "{ .reg .b32 t, m; xor.b32 t, $4, 0x80808080; mov.b32 m, 0x3F800000; prmt.b32 $0, t, m, 0x7604; "
    "prmt.b32 $1, t, m, 0x7614; prmt.b32 $2, t, m, 0x7624; prmt.b32 $3, t, m, 0x7634; }")


@triton.jit
def unit_floats(q, ASM: tl.constexpr):
    """float32 ``1 + q / 128`` of an int8 tensor ``0 <= q < 128``, exactly: on the GPU the byte, its top bit set,
    becomes bits 16-23 of a float whose top byte is 0x3F (exponent 0), one byte permute per weight."""
    if ASM:
        return tl.inline_asm_elementwise(UNIT_FLOATS_PTX, "=r,=r,=r,=r,r", [q], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return 1.0 + q.to(tl.float32) * 0.0078125


@triton.jit
def byte_floats(q, ASM: tl.constexpr):
    """float32 ``1 + (q + 128) / 32768`` of a tensor of 8-bit ``q`` (read as int8), exactly: the byte, offset
    to unsigned, as bits 8-15 of 1.0's bits (0x3F800000)."""
    if ASM:
        return tl.inline_asm_elementwise(BYTE_FLOATS_PTX, "=r,=r,=r,=r,r", [q], dtype=tl.float32, is_pure=True, pack=4)
    else:
        return 1.0 + (q.to(tl.int8, bitcast=True).to(tl.float32) + 128.0) * 0.000030517578125


@triton.jit
def _weights(u, scale, bias, x_ptr):
    """``u * scale - bias`` in float32 (one fused multiply-add), rounded to x's dtype: the MMA's first operand."""
    return (u * scale - bias).to(x_ptr.dtype.element_ty)


@triton.jit
def _activations(x_ptr, tokens, T, stride_x, first_col):
    """``[32, BM]``: columns ``first_col ..`` of x for each token (zeros past ``T``)."""
    cols = first_col + tl.arange(0, 32)[:, None]
    return tl.load(x_ptr + tokens[None, :] * stride_x + cols, mask=tokens[None, :] < T, other=0.0)


@triton.jit
def _block_bytes(block, c, QTYPE: tl.constexpr):
    """``[BN, 32]`` quant bytes of one Q4_0 / Q8_0 block per row (Q4_0: byte c % 16 for column c)."""
    if QTYPE == Q4_0:
        return tl.load(block + 2 + c % 16)
    else:
        return tl.load(block + 2 + c)


@triton.jit
def dot16_kernel(x_ptr, w_ptr, out_ptr, T, N, K, K_SPLIT, stride_x, row_bytes,
                 QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                 GROUP: tl.constexpr = 1, PDL: tl.constexpr = False):
    """Program (row tile, token tile, K split): ``out[pid_k, t, n]`` over its ``K_SPLIT`` columns.
    ``row_bytes``: bytes between weight rows (4-aligned for Q4_K's 32-bit words, 2 for the others)."""
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BN + tl.arange(0, BN)
    rows = w_ptr + tl.minimum(offs_n, N - 1).to(tl.int64)[:, None] * row_bytes   # [BN, 1]; tail rows never stored
    tokens = pid_m * BM + tl.arange(0, BM)
    c = tl.arange(0, 32)[None, :]
    wait_for_previous(PDL, LAUNCH_NEXT=False)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    if QTYPE == Q4_K or QTYPE == Q6_K:
        first = pid_k * (K_SPLIT // 256)
        for sb in range(first, first + K_SPLIT // 256):
            block = rows + sb * TS
            k0 = sb * 256
            if QTYPE == Q4_K:  # d, dmin, scales[12], qs[128]: sub-block s is nibble s % 2 of bytes 32 (s // 2)..
                dd = _u32(block, 0)
                d128 = half_bits(dd) * 128.0
                dmin = half_bits(dd >> 16)
                sw0, sw1, sw2 = _u32(block + 4, 0), _u32(block + 4, 1), _u32(block + 4, 2)
                for s in tl.static_range(8):
                    if s % 2 == 0:
                        byte = tl.load(block + 16 + 16 * s + c)                             # [BN, 32]
                    sc, mn = _k_scale_min_words(sw0, sw1, sw2, s)
                    scale = d128 * sc
                    w = _weights(unit_floats(nibbles(byte, 4 * (s % 2), ASM), ASM), scale, scale + dmin * mn, x_ptr)
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
                    w = (q.to(tl.float32) * (d * tl.where(c < 16, sc_low, sc_high))).to(x_ptr.dtype.element_ty)
                    acc = tl.dot(w, _activations(x_ptr, tokens, T, stride_x, k0 + 32 * s), acc)
    else:  # Q4_0: d, qs[16] (q - 8); Q8_0: d, qs[32] int8. GROUP blocks per iteration, a dot each
        first = pid_k * (K_SPLIT // 32)
        for g in range(first, first + K_SPLIT // 32, GROUP):
            for i in tl.static_range(GROUP):
                block = rows + (g + i) * TS
                d = half_bits(_u16(block, 0))
                q = _block_bytes(block, c, QTYPE)
                if QTYPE == Q4_0:
                    u = unit_floats(tl.where(c < 16, nibbles(q, 0, ASM), nibbles(q, 4, ASM)), ASM)
                    w = _weights(u, d * 128.0, d * 136.0, x_ptr)
                else:
                    w = _weights(byte_floats(q, ASM), d * 32768.0, d * 32896.0, x_ptr)
                acc = tl.dot(w, _activations(x_ptr, tokens, T, stride_x, (g + i) * 32), acc)
    out = out_ptr + (pid_k * T + tokens[None, :]).to(tl.int64) * N + offs_n[:, None]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(tokens[None, :] < T) & (offs_n[:, None] < N))
