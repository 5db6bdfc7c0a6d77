"""Triton kernels: one paged-attention kernel for prefill (over a cached prefix) and decode, and
a KV store. Layouts match the references: q [T, H, D]; caches [num_blocks, block_size, KVH, D];
``block_tables`` [num_seqs, max_blocks] int32; ``query_start_loc`` [num_seqs + 1];
``seq_lens`` [num_seqs] = cached + new tokens.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_pdl import wait_for_previous


@triton.jit
def page_slots(block_table, n, n_valid, PAGE: tl.constexpr):
    """Where context positions ``n`` live in a paged cache: ``(block ids [N] int64, offsets in the block)``, from
    the sequence's row of the block table (positions outside ``n_valid`` read block 0)."""
    return tl.load(block_table + n // PAGE, mask=n_valid, other=0).to(tl.int64), n % PAGE


@triton.jit
def kv_tile(cache_ptr, block_ids, offsets, kv_head, d, stride_b, stride_s, stride_h, mask):
    """One kv head's ``[N, D]`` tile of a paged K or V cache at ``page_slots``' places (0 outside ``mask``)."""
    return tl.load(cache_ptr + block_ids[:, None] * stride_b + offsets[:, None] * stride_s + kv_head * stride_h
                   + d[None, :], mask=mask, other=0.0)


@triton.jit(do_not_specialize=["stride_bt", "sliding_window"])  # block-table width changes every few steps
def paged_attention_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
        scale, softcap, sliding_window,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr,
        USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr = False):
    """Program (seq, kv_head, q_tile): BLOCK_Q query tokens x the GROUP query heads sharing kv_head,
    flattened into BLOCK_Q * GROUP_PAD rows, attend causally over the sequence's paged context
    with an online softmax (fp32 accumulation). ``PDL``: ``kernels/triton_pdl``."""
    wait_for_previous(PDL)
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    q_tile = tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_begin
    if q_tile * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    first_pos = seq_len - q_len  # position of the sequence's first new token

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    q_idx = q_tile * BLOCK_Q + rows // GROUP_PAD
    head = kv_head * GROUP + rows % GROUP_PAD
    row_valid = (q_idx < q_len) & (rows % GROUP_PAD < GROUP)
    q_pos = first_pos + q_idx
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    token = (q_begin + q_idx).to(tl.int64)
    q = tl.load(q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None] & d_valid[None, :], other=0.0)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, BLOCK_D], tl.float32)
    end = tl.minimum(seq_len, first_pos + tl.minimum((q_tile + 1) * BLOCK_Q, q_len))  # past the last query
    start = 0
    if USE_WINDOW:
        start = tl.maximum(first_pos + q_tile * BLOCK_Q - sliding_window + 1, 0) // BLOCK_N * BLOCK_N
    for n_start in range(start, end, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_valid = n < end
        block_ids, offsets = page_slots(block_tables_ptr + seq * stride_bt, n, n_valid, PAGE)
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = kv_tile(k_cache_ptr, block_ids, offsets, kv_head, d, stride_kb, stride_ks, stride_kh, kv_mask)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        if USE_SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap * tanh(s / softcap)
        visible = (n[None, :] <= q_pos[:, None]) & n_valid[None, :]
        if USE_WINDOW:
            visible = visible & (n[None, :] > q_pos[:, None] - sliding_window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = kv_tile(v_cache_ptr, block_ids, offsets, kv_head, d, stride_vb, stride_vs, stride_vh, kv_mask)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :],
             acc.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_valid[None, :])


@triton.jit
def store_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
                    stride_kt, stride_kh, stride_vt, stride_vh,
                    stride_kb, stride_ks, stride_kch, stride_vb, stride_vs, stride_vch,
                    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
                    BLOCK_D: tl.constexpr, PAGE: tl.constexpr):
    """Program t copies token t's K and V (all kv heads) into its slot; slot < 0 means padding."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:
        return
    block = slot // PAGE
    offset = slot % PAGE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h[:, None] < NUM_KV_HEADS) & (d[None, :] < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    tl.store(k_cache_ptr + block * stride_kb + offset * stride_ks + h[:, None] * stride_kch + d[None, :],
             k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + block * stride_vb + offset * stride_vs + h[:, None] * stride_vch + d[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)
