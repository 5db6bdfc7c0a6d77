"""Triton prefill kernels for Gated DeltaNet: causal conv1d over prompts and the chunked gated delta rule.

Same contracts as the torch references in ``kernels/recurrent_reference.py`` (flat varlen batch,
``query_start_loc``, a state pool with ``slots`` / ``fresh``), and like them they never move data
to the host: grids are sized from ``T`` and the number of sequences, so nothing waits on the GPU.

Chunked gated delta rule (chunks of ``CHUNK`` tokens, counted from each sequence's start), per
value head, with ``G_t`` the within-chunk cumulative sum of ``g`` and ``A`` the strictly lower
``A_ts = beta_t exp(G_t - G_s) k_t.k_s``:

1. ``_gdr_chunk_prep`` (one program per chunk and head, all chunks in parallel): ``G``, ``A`` and
   ``w = (I + A)^-1 (beta exp(G) k)``, ``u = (I + A)^-1 (beta v)`` (the WY form: the chunk's
   corrected values are ``u - w S``), solved by blocks of 16 rows (see the kernel).
2. ``_gdr_chunk_scan`` (one program per sequence, head and block of value columns, the chunks of
   the sequence in order): from the state ``S`` (the slot's, or zero when fresh) each chunk gives
   ``v' = u - w S``, ``o = exp(G) q S + (q k^T . exp(G_t - G_s))_{s<=t} v'``,
   ``S <- exp(G_last) S + (exp(G_last - G) k)^T v'``; the final ``S`` goes back to the slot.

q and k are L2-normalised inside both kernels (q also scaled by ``dk ** -0.5``), so callers pass the
conv output's views as they are.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

CHUNK = 64
L2_EPS = 1e-6
# Launch shapes of the chunked gated delta rule, chosen from ptxas' counts for sm_90 (Triton 3.6)
# at Qwen3.5's 128-wide heads, bf16 model (tf32 dots), not yet timed on a GPU: 8 warps spill least
# (prep 255 registers + 832 B stack, scan 255 + 2576 B); one stage keeps the scan at 90 KB of shared
# memory (3 stages need 200+ KB, past what fp32 tiles leave on an H100).
PREP_WARPS, SCAN_WARPS, SCAN_STAGES, SCAN_BLOCK_V = 8, 8, 1, 32
# the conv over prompts: 8 x 128 tiles take 128 registers a thread on sm_90 (16 x 128: 251)
CONV_BLOCK_T, CONV_BLOCK_C, CONV_STATE_BLOCK_C = 8, 128, 64


# ---- causal depthwise conv1d over prompts --------------------------------------------------------
@triton.jit
def _conv_prefill_kernel(x_ptr, w_ptr, bias_ptr, state_ptr, qsl_ptr, seq_of_ptr, slots_ptr, fresh_ptr, out_ptr,
                         tokens, channels, stride_x, stride_state_slot, stride_out,
                         WIDTH: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
                         HAS_STATE: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row_ok = rows < tokens
    col_ok = cols < channels
    seq = tl.load(seq_of_ptr + rows, mask=row_ok, other=0)
    start = tl.load(qsl_ptr + seq, mask=row_ok, other=0)
    acc = tl.zeros([BLOCK_T, BLOCK_C], dtype=tl.float32)
    slot = tl.load(slots_ptr + seq, mask=row_ok, other=0).to(tl.int64)
    keep = tl.load(fresh_ptr + seq, mask=row_ok, other=1) == 0  # a fresh slot's old content is never read
    for i in tl.static_range(WIDTH):
        pos = rows - (WIDTH - 1) + i                       # the input this tap reads
        inside = pos >= start
        xv = tl.load(x_ptr + pos.to(tl.int64)[:, None] * stride_x + cols[None, :],
                     mask=(row_ok & inside)[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
        if HAS_STATE:  # before the sequence's first token: the slot's window (zero when fresh)
            back = (WIDTH - 1) + pos - start
            sv = tl.load(state_ptr + slot[:, None] * stride_state_slot + cols[None, :] * (WIDTH - 1) + back[:, None],
                         mask=(row_ok & ~inside & keep)[:, None] & col_ok[None, :], other=0.0).to(tl.float32)
            xv += sv
        acc += xv * tl.load(w_ptr + cols * WIDTH + i, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION:
        acc = acc / (1.0 + tl.exp(-acc))
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _conv_state_kernel(x_ptr, state_ptr, qsl_ptr, slots_ptr, fresh_ptr, channels, stride_x, stride_state_slot,
                       WIDTH: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_W: tl.constexpr):
    """Each slot's window becomes the last K - 1 inputs of its sequence (older ones from the window
    itself when the sequence is shorter than K - 1). Runs after the conv, which read the old windows."""
    seq = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    taps = tl.arange(0, BLOCK_W)
    col_ok = cols < channels
    tap_ok = taps < WIDTH - 1
    start, end = tl.load(qsl_ptr + seq), tl.load(qsl_ptr + seq + 1)
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    keep = tl.load(fresh_ptr + seq + 0 * taps) == 0  # (a vector: scalar masks upset the interpreter)
    pos = end - (WIDTH - 1) + taps
    inside = pos >= start
    ok = col_ok[:, None] & tap_ok[None, :]
    xv = tl.load(x_ptr + pos.to(tl.int64)[None, :] * stride_x + cols[:, None], mask=ok & inside[None, :], other=0.0)
    window = state_ptr + slot * stride_state_slot + cols[:, None] * (WIDTH - 1)
    old = tl.load(window + ((WIDTH - 1) + pos - start)[None, :], mask=ok & (~inside & keep)[None, :], other=0.0)
    new = xv.to(tl.float32) + old.to(tl.float32)
    tl.debug_barrier()  # all of this program's reads of the old window happen before its writes
    tl.store(window + taps[None, :], new.to(state_ptr.dtype.element_ty), mask=ok)


def _seq_of_tokens(query_start_loc: torch.Tensor, tokens: int) -> torch.Tensor:
    """Each token's sequence. Tokens past the last sequence's end (a captured graph's padding) count
    as the last sequence's: their rows come out as garbage nobody reads, but every load stays in bounds."""
    positions = torch.arange(tokens, device=query_start_loc.device, dtype=query_start_loc.dtype)
    seq = torch.searchsorted(query_start_loc[1:].contiguous(), positions, right=True)
    return seq.clamp_(max=query_start_loc.shape[0] - 2).to(torch.int32)


def _slots_fresh(slots, fresh, num_seqs, device):
    if slots is None:
        slots = torch.zeros(num_seqs, dtype=torch.int64, device=device)
    if fresh is None:
        fresh = torch.ones(num_seqs, dtype=torch.bool, device=device)
    return slots, fresh.to(torch.int8)


def causal_conv1d_prefill(x, weight, bias, state, query_start_loc, slots, fresh, activation: bool = True):
    """Same contract as the reference: x [T, C] (rows may be strided), weight [C, K],
    state [num_slots, C, K - 1] or None; returns [T, C] in x's dtype, windows updated in place."""
    tokens, channels = x.shape
    width = weight.shape[1]
    num_seqs = query_start_loc.shape[0] - 1
    out = torch.empty(tokens, channels, dtype=x.dtype, device=x.device)
    weight = weight.contiguous()
    qsl = query_start_loc.to(torch.int32)
    slots, fresh8 = _slots_fresh(slots, fresh, num_seqs, x.device)
    has_state = state is not None
    state_arg = state if has_state else out  # never read when HAS_STATE is off
    if tokens and num_seqs:
        _conv_prefill_kernel[(triton.cdiv(tokens, CONV_BLOCK_T), triton.cdiv(channels, CONV_BLOCK_C))](
            x, weight, bias if bias is not None else weight, state_arg, qsl, _seq_of_tokens(qsl, tokens), slots, fresh8,
            out, tokens, channels, x.stride(0), state.stride(0) if has_state else 0, out.stride(0),
            WIDTH=width, BLOCK_T=CONV_BLOCK_T, BLOCK_C=CONV_BLOCK_C, HAS_STATE=has_state, HAS_BIAS=bias is not None,
            ACTIVATION=activation)
    if has_state and num_seqs:
        _conv_state_kernel[(num_seqs, triton.cdiv(channels, CONV_STATE_BLOCK_C))](
            x, state, qsl, slots, fresh8, channels, x.stride(0), state.stride(0),
            WIDTH=width, BLOCK_C=CONV_STATE_BLOCK_C, BLOCK_W=triton.next_power_of_2(width - 1))
    return out


causal_conv1d_prefill.supports = lambda x, weight, bias, state, *a, **k: (
    weight.shape[1] >= 2 and x.stride(1) == 1 and (state is None or state.is_contiguous()))


# ---- chunked gated delta rule ------------------------------------------------------------------------
# Tiles are addressed from a per-chunk scalar base pointer (int64) plus int32 offsets within the
# chunk: 64-bit offset tiles would cost two registers per element. Everything is fp32 inside, the
# dots at PRECISION: "tf32x3" for fp32 models (three tensor-core products, about fp32's accuracy;
# "ieee" FMA dots spill three times as much), "tf32" for 16-bit ones. bf16 dot operands (as some
# implementations use; faster, half the shared memory) put ~1% error on the state after 200
# tokens against the fp32 reference in the interpreter's emulation, so they are not used until a
# GPU session weighs that against the speed.
@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _load_l2(base, offs, row_ok, stride_t, dcols, dk, SCALE):
    """[rows, BDK] of a q/k head, L2-normalised in fp32 (padding rows and columns are zero)."""
    x = tl.load(base + offs[:, None] * stride_t + dcols[None, :],
                mask=row_ok[:, None] & (dcols < dk)[None, :], other=0.0).to(tl.float32)
    return x * (tl.rsqrt(tl.sum(x * x, axis=1) + 1e-6) * SCALE)[:, None]


@triton.jit
def _inv_unit_lower16(a):
    """``(I + a)^-1`` of a strictly lower [16, 16] tile by forward substitution: row i is
    ``e_i - a[i, :] @ (rows above)`` (a[i, j] is zero for j >= i, so later rows do not contribute)."""
    idx = tl.arange(0, 16)
    inv = tl.where(idx[:, None] == idx[None, :], 1.0, 0.0)
    for i in tl.static_range(1, 16):
        a_row = tl.sum(tl.where(idx[:, None] == i, a, 0.0), axis=0)
        new_row = tl.where(idx == i, 1.0, 0.0) - tl.sum(a_row[:, None] * inv, axis=0)
        inv = tl.where(idx[:, None] == i, new_row[None, :], inv)
    return inv


@triton.jit
def _a_block(k_i, k_j, gcum_i, gcum_j, beta_i, DIAG: tl.constexpr, PRECISION: tl.constexpr):
    """Rows i, columns j of ``A`` (16 x 16); block i comes after block j, or is it (DIAG: strictly lower)."""
    kk = _mm(k_i, tl.trans(k_j), PRECISION)
    if DIAG:
        idx = tl.arange(0, 16)
        below = idx[:, None] > idx[None, :]
        return tl.where(below, kk * tl.exp(tl.where(below, gcum_i[:, None] - gcum_j[None, :], 0.0))
                        * beta_i[:, None], 0.0)
    return kk * tl.exp(gcum_i[:, None] - gcum_j[None, :]) * beta_i[:, None]


@triton.jit
def _load_rows(base, offs, row_ok, stride_t, cols, width):
    return tl.load(base + offs[:, None] * stride_t + cols[None, :], mask=row_ok[:, None] & (cols < width)[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _store_rows(base, offs, row_ok, stride_t, cols, width, x):
    tl.store(base + offs[:, None] * stride_t + cols[None, :], x.to(base.dtype.element_ty),
             mask=row_ok[:, None] & (cols < width)[None, :])


@triton.jit
def _gdr_chunk_prep(k_ptr, v_ptr, g_ptr, beta_ptr, qsl_ptr, chunk_seq_ptr, chunk_first_ptr, w_ptr, u_ptr, gcum_ptr,
                    num_seqs, stride_kt, stride_kh, stride_vt, stride_vh, stride_gt, stride_wt,
                    stride_wh, stride_ut, stride_uh, ratio, dk, dv,
                    BDK: tl.constexpr, BDV: tl.constexpr, PRECISION: tl.constexpr):
    """One 64-token chunk of one value head, as four 16-row blocks b: solves ``(I + A) [w | u] =
    [beta exp(G) k | beta v]`` block by block (W_b = D_b (rhs_b - sum_{c<b} A_bc W_c) with D_b the
    inverse of the diagonal block), so only 16 x 16 tiles are substituted row by row. g and beta
    are [T, HV] float32 (row stride ``stride_gt``); gcum has their layout."""
    chunk, head = tl.program_id(0), tl.program_id(1)
    seq = tl.load(chunk_seq_ptr + chunk)
    if seq >= num_seqs:  # the grid is an upper bound on the number of chunks
        return
    first = tl.load(chunk_first_ptr + chunk)
    rows_left = tl.load(qsl_ptr + seq + 1) - first
    row0 = first.to(tl.int64)
    dks, dvs = tl.arange(0, BDK), tl.arange(0, BDV)
    kb = k_ptr + row0 * stride_kt + (head // ratio) * stride_kh
    vb = v_ptr + row0 * stride_vt + head * stride_vh
    gb, bb, cb = g_ptr + row0 * stride_gt + head, beta_ptr + row0 * stride_gt + head, gcum_ptr + row0 * stride_gt + head
    wb, ub = w_ptr + row0 * stride_wt + head * stride_wh, u_ptr + row0 * stride_ut + head * stride_uh
    o0 = tl.arange(0, 16)
    o1, o2, o3 = o0 + 16, o0 + 32, o0 + 48
    m0, m1, m2, m3 = o0 < rows_left, o1 < rows_left, o2 < rows_left, o3 < rows_left
    g0 = tl.load(gb + o0 * stride_gt, mask=m0, other=0.0)
    g1 = tl.load(gb + o1 * stride_gt, mask=m1, other=0.0)
    g2 = tl.load(gb + o2 * stride_gt, mask=m2, other=0.0)
    g3 = tl.load(gb + o3 * stride_gt, mask=m3, other=0.0)
    b0 = tl.load(bb + o0 * stride_gt, mask=m0, other=0.0)
    b1 = tl.load(bb + o1 * stride_gt, mask=m1, other=0.0)
    b2 = tl.load(bb + o2 * stride_gt, mask=m2, other=0.0)
    b3 = tl.load(bb + o3 * stride_gt, mask=m3, other=0.0)
    # G: the cumulative sum of g from the chunk's first token
    c0 = tl.cumsum(g0, axis=0)
    c1 = tl.cumsum(g1, axis=0) + tl.sum(g0)
    c2 = tl.cumsum(g2, axis=0) + (tl.sum(g0) + tl.sum(g1))
    c3 = tl.cumsum(g3, axis=0) + (tl.sum(g0) + tl.sum(g1) + tl.sum(g2))
    tl.store(cb + o0 * stride_gt, c0, mask=m0)
    tl.store(cb + o1 * stride_gt, c1, mask=m1)
    tl.store(cb + o2 * stride_gt, c2, mask=m2)
    tl.store(cb + o3 * stride_gt, c3, mask=m3)
    k0 = _load_l2(kb, o0, m0, stride_kt, dks, dk, 1.0)
    k1 = _load_l2(kb, o1, m1, stride_kt, dks, dk, 1.0)
    k2 = _load_l2(kb, o2, m2, stride_kt, dks, dk, 1.0)
    k3 = _load_l2(kb, o3, m3, stride_kt, dks, dk, 1.0)
    a10 = _a_block(k1, k0, c1, c0, b1, False, PRECISION)
    a20 = _a_block(k2, k0, c2, c0, b2, False, PRECISION)
    a21 = _a_block(k2, k1, c2, c1, b2, False, PRECISION)
    a30 = _a_block(k3, k0, c3, c0, b3, False, PRECISION)
    a31 = _a_block(k3, k1, c3, c1, b3, False, PRECISION)
    a32 = _a_block(k3, k2, c3, c2, b3, False, PRECISION)
    d0 = _inv_unit_lower16(_a_block(k0, k0, c0, c0, b0, True, PRECISION))
    d1 = _inv_unit_lower16(_a_block(k1, k1, c1, c1, b1, True, PRECISION))
    d2 = _inv_unit_lower16(_a_block(k2, k2, c2, c2, b2, True, PRECISION))
    d3 = _inv_unit_lower16(_a_block(k3, k3, c3, c3, b3, True, PRECISION))
    # w = (I + A)^-1 (beta exp(G) k), block by block
    x0 = _mm(d0, k0 * (b0 * tl.exp(c0))[:, None], PRECISION)
    _store_rows(wb, o0, m0, stride_wt, dks, dk, x0)
    x1 = _mm(d1, k1 * (b1 * tl.exp(c1))[:, None] - _mm(a10, x0, PRECISION), PRECISION)
    _store_rows(wb, o1, m1, stride_wt, dks, dk, x1)
    x2 = _mm(d2, k2 * (b2 * tl.exp(c2))[:, None] - _mm(a20, x0, PRECISION) - _mm(a21, x1, PRECISION),
             PRECISION)
    _store_rows(wb, o2, m2, stride_wt, dks, dk, x2)
    x3 = _mm(d3, k3 * (b3 * tl.exp(c3))[:, None] - _mm(a30, x0, PRECISION) - _mm(a31, x1, PRECISION)
             - _mm(a32, x2, PRECISION), PRECISION)
    _store_rows(wb, o3, m3, stride_wt, dks, dk, x3)
    # u = (I + A)^-1 (beta v), the same way
    y0 = _mm(d0, _load_rows(vb, o0, m0, stride_vt, dvs, dv) * b0[:, None], PRECISION)
    _store_rows(ub, o0, m0, stride_ut, dvs, dv, y0)
    y1 = _mm(d1, _load_rows(vb, o1, m1, stride_vt, dvs, dv) * b1[:, None] - _mm(a10, y0, PRECISION),
             PRECISION)
    _store_rows(ub, o1, m1, stride_ut, dvs, dv, y1)
    y2 = _mm(d2, _load_rows(vb, o2, m2, stride_vt, dvs, dv) * b2[:, None] - _mm(a20, y0, PRECISION)
             - _mm(a21, y1, PRECISION), PRECISION)
    _store_rows(ub, o2, m2, stride_ut, dvs, dv, y2)
    y3 = _mm(d3, _load_rows(vb, o3, m3, stride_vt, dvs, dv) * b3[:, None] - _mm(a30, y0, PRECISION)
             - _mm(a31, y1, PRECISION) - _mm(a32, y2, PRECISION), PRECISION)
    _store_rows(ub, o3, m3, stride_ut, dvs, dv, y3)


@triton.jit
def _gdr_chunk_scan(q_ptr, k_ptr, w_ptr, u_ptr, gcum_ptr, state_ptr, qsl_ptr, slots_ptr, fresh_ptr, out_ptr,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_wt, stride_wh, stride_ut, stride_uh, stride_ct,
                    stride_ot, stride_oh, stride_ss, stride_sh, ratio, dk, dv, scale,
                    BT: tl.constexpr, BDK: tl.constexpr, BV: tl.constexpr, HAS_STATE: tl.constexpr,
                    PRECISION: tl.constexpr):
    seq, head, vblock = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    start, end = tl.load(qsl_ptr + seq), tl.load(qsl_ptr + seq + 1)
    dks = tl.arange(0, BDK)
    vcols = vblock * BV + tl.arange(0, BV)
    dk_ok, v_ok = dks < dk, vcols < dv
    idx = tl.arange(0, BT)
    causal = idx[:, None] >= idx[None, :]
    slot = tl.load(slots_ptr + seq).to(tl.int64)
    keep = tl.load(fresh_ptr + seq + 0 * vcols) == 0  # (a vector: scalar masks upset the interpreter)
    s_ptrs = state_ptr + slot * stride_ss + head * stride_sh + dks[:, None] * dv + vcols[None, :]
    if HAS_STATE:
        s = tl.load(s_ptrs, mask=dk_ok[:, None] & (v_ok & keep)[None, :], other=0.0)
    else:
        s = tl.zeros([BDK, BV], dtype=tl.float32)
    khead = head // ratio
    for first in range(start, end, BT):
        row_ok = idx < end - first
        row0 = tl.cast(first, tl.int64)  # (the interpreter hands the loop a Python int)
        gcum = tl.load(gcum_ptr + row0 * stride_ct + head + idx * stride_ct, mask=row_ok, other=0.0)
        last = tl.sum(tl.where(idx == tl.minimum(BT, end - first) - 1, gcum, 0.0))
        # v' = u - w S (the chunk's values corrected by what the state already predicts)
        w = _load_rows(w_ptr + row0 * stride_wt + head * stride_wh, idx, row_ok, stride_wt, dks, dk)
        corrected = _load_rows(u_ptr + row0 * stride_ut + head * stride_uh, idx, row_ok, stride_ut, vcols, dv)
        corrected -= _mm(w, s, PRECISION)
        # o = exp(G) q S + (q k^T . exp(G_t - G_s))_{s <= t} v'
        q = _load_l2(q_ptr + row0 * stride_qt + khead * stride_qh, idx, row_ok, stride_qt, dks, dk, scale)
        k = _load_l2(k_ptr + row0 * stride_kt + khead * stride_kh, idx, row_ok, stride_kt, dks, dk, 1.0)
        scores = _mm(q, tl.trans(k), PRECISION)
        scores = tl.where(causal, scores * tl.exp(tl.where(causal, gcum[:, None] - gcum[None, :], 0.0)), 0.0)
        out = _mm(q * tl.exp(gcum)[:, None], s, PRECISION) + _mm(scores, corrected, PRECISION)
        _store_rows(out_ptr + row0 * stride_ot + head * stride_oh, idx, row_ok, stride_ot, vcols, dv, out)
        # S <- exp(G_last) S + (exp(G_last - G) k)^T v'
        carried = k * tl.where(row_ok, tl.exp(last - gcum), 0.0)[:, None]
        s = s * tl.exp(last) + _mm(tl.trans(carried), corrected, PRECISION)
    if HAS_STATE:
        tl.store(s_ptrs, s, mask=dk_ok[:, None] & v_ok[None, :])


def _chunk_map(query_start_loc: torch.Tensor, tokens: int, chunk: int):
    """Per chunk program (an upper bound of ``tokens // chunk + num_seqs`` of them): its sequence
    (``num_seqs`` for the spare ones) and its first token, computed on the device."""
    num_seqs = query_start_loc.shape[0] - 1
    bound = tokens // chunk + num_seqs
    lengths = query_start_loc[1:] - query_start_loc[:-1]
    ends = ((lengths + chunk - 1) // chunk).cumsum(0)                       # chunks up to each sequence
    ids = torch.arange(bound, device=query_start_loc.device, dtype=ends.dtype)
    seq = torch.searchsorted(ends.contiguous(), ids, right=True)
    safe = seq.clamp(max=max(num_seqs - 1, 0))
    before = ends[safe] - (lengths[safe] + chunk - 1) // chunk
    first = query_start_loc[safe] + (ids - before) * chunk
    return seq.to(torch.int32), first.to(torch.int32), bound


def gated_delta_rule_prefill(q, k, v, g, beta, state, query_start_loc, slots, fresh, chunk_size: int = CHUNK):
    """Same contract as the reference: q, k [T, HK, dk]; v [T, HV, dv]; g, beta [T, HV];
    state [num_slots, HV, dk, dv] float32 (or None); returns [T, HV, dv] in v's dtype."""
    if chunk_size != CHUNK:  # the chunk kernel is written for four 16-row blocks
        raise ValueError(f"the Triton chunked gated delta rule uses chunks of {CHUNK}, not {chunk_size}")
    tokens, heads, dv = v.shape
    dk = q.shape[-1]
    num_seqs = query_start_loc.shape[0] - 1
    out = torch.empty(tokens, heads, dv, dtype=v.dtype, device=v.device)
    if num_seqs == 0:
        return out
    qsl = query_start_loc.to(torch.int32)
    slots, fresh8 = _slots_fresh(slots, fresh, num_seqs, v.device)
    g, beta = g.float().contiguous(), beta.float().contiguous()  # [T, HV], head stride 1
    precision = "tf32x3" if v.dtype == torch.float32 else "tf32"
    bdk, bdv = max(16, triton.next_power_of_2(dk)), max(16, triton.next_power_of_2(dv))
    ratio = heads // k.shape[1]
    w = torch.empty(tokens, heads, dk, dtype=torch.float32, device=v.device)
    u = torch.empty(tokens, heads, dv, dtype=torch.float32, device=v.device)
    gcum = torch.empty(tokens, heads, dtype=torch.float32, device=v.device)
    if tokens:
        chunk_seq, chunk_first, bound = _chunk_map(qsl, tokens, chunk_size)
        _gdr_chunk_prep[(bound, heads)](
            k, v, g, beta, qsl, chunk_seq, chunk_first, w, u, gcum, num_seqs,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), w.stride(0),
            w.stride(1), u.stride(0), u.stride(1), ratio, dk, dv,
            BDK=bdk, BDV=bdv, PRECISION=precision, num_warps=PREP_WARPS, num_stages=1)
    has_state = state is not None
    block_v = min(SCAN_BLOCK_V, bdv)
    _gdr_chunk_scan[(num_seqs, heads, triton.cdiv(dv, block_v))](
        q, k, w, u, gcum, state if has_state else gcum, qsl, slots, fresh8, out,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), w.stride(0), w.stride(1), u.stride(0), u.stride(1),
        gcum.stride(0), out.stride(0), out.stride(1), state.stride(0) if has_state else 0,
        state.stride(1) if has_state else 0, ratio, dk, dv, dk ** -0.5,
        BT=chunk_size, BDK=bdk, BV=block_v, HAS_STATE=has_state, PRECISION=precision,
        num_warps=SCAN_WARPS, num_stages=SCAN_STAGES)
    return out


def _gdr_supported(q, k, v, g, beta, state, query_start_loc, slots, fresh, chunk_size=CHUNK):
    return (q.stride(-1) == 1 and k.stride(-1) == 1 and v.stride(-1) == 1 and chunk_size == CHUNK
            and (state is None or (state.dtype == torch.float32 and state.is_contiguous())))


gated_delta_rule_prefill.supports = _gdr_supported

OPS = {"causal_conv1d_prefill": causal_conv1d_prefill, "gated_delta_rule_prefill": gated_delta_rule_prefill}
