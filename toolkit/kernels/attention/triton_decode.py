"""Split-context attention for decode steps (one new token per sequence), in one launch.

Why: ``paged_attention_kernel`` runs one program per (sequence, kv head), which walks the whole context
block after block. At batch 1 an 8-kv-head model runs 8 programs on a 132-SM GPU, each paying a memory
round trip per 64 context tokens: 8.3 us per layer for the 8B Llama at ~200 tokens, 6.5 us for the 1.5B
(H100, ``bench/profile_decode.py``), ~10% of their decode step. Here each (sequence, kv head) gets
``SPLITS`` programs, one per slice of the context. Each writes its softmax partials (row maximum, sum of
exponentials, exponential-weighted values) to a scratch buffer; the last of the ``SPLITS`` to finish,
found by an atomic counter per (sequence, kv head), combines them and writes the output, so the step
launches no extra kernel. That program sets the counter back to zero, so a replayed CUDA graph finds it
as the first launch did. Measured in the engine (H100, CUDA graphs, 128-token prompts, 128 new tokens, against
``TOOLKIT_DECODE_SPLITS=1`` in the same call): batch 1 decode 988 -> 1,025 tok/s (1.5B Q4_0), 794 -> 820
(1.5B Q4_K_M), 315 -> 321 (8B Q4_K_M); batch 8 (4 slices) +1.5% and +1% for the 1.5B files, -0.8% for the 8B.

Layouts as in ``triton_kernels``: q/out ``[T, H, D]``, caches ``[num_blocks, block_size, KVH, D]``.
Scratch: ``acc_part_ptr [seqs * KVH, SPLITS, ROWS, BLOCK_D]`` and ``ml_part_ptr [seqs * KVH, SPLITS, 2, ROWS]``
float32 (``ROWS``: the head group rounded up to a power of two); ``counts [>= seqs * KVH]`` int32, zero.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..triton_int8 import store_int8_blocks
from ..triton_pdl import wait_for_previous
from .triton_kernels import kv_tile, page_slots


@triton.jit
def _combine(out_ptr, acc_part_ptr, ml_part_ptr, slot, token, kv_head, stride_ot, stride_oh,
             q8_ptr, d8_ptr, s8_ptr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr,
             ROWS: tl.constexpr, SPLITS: tl.constexpr, QUANT: tl.constexpr, SUMS: tl.constexpr):
    """The output of (sequence, kv head) ``slot`` from its SPLITS partials. ``.cg`` loads: the partials were
    written by other SMs, so they are read from L2, never from a line this SM may hold.

    ``QUANT`` (``HEAD_DIM`` a power of two >= 32): the stored output's int8 blocks of 32 too
    (``kernels/int8_blocks.py``, as ``rms_norm_kernel`` writes them) for the output projection: the token's row
    ``[H * HEAD_DIM]`` at ``q8`` (int8), its scales (and with ``SUMS`` block sums) at ``d8``/``s8``; this head
    group's blocks are one run of ``GROUP * HEAD_DIM / 32`` there."""
    s = tl.arange(0, SPLITS)[:, None]
    r = tl.arange(0, ROWS)[None, :]
    ml = ml_part_ptr + (slot * SPLITS + s) * (2 * ROWS) + r                                  # [SPLITS, ROWS]
    m = tl.load(ml, cache_modifier=".cg")
    l = tl.load(ml + ROWS, cache_modifier=".cg")
    m_max = tl.max(m, 0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.exp(m - m_safe[None, :])                                        # 0 for a slice that saw nothing
    total = tl.sum(w * l, 0)
    d = tl.arange(0, BLOCK_D)[None, None, :]
    parts = tl.load(acc_part_ptr + ((slot * SPLITS + s[:, :, None]) * ROWS + r[:, :, None]) * BLOCK_D + d,
                    cache_modifier=".cg")                                                # [SPLITS, ROWS, BLOCK_D]
    o = tl.sum(parts * w[:, :, None], 0) / tl.where(total == 0.0, 1.0, total)[:, None]
    rows = tl.arange(0, ROWS)[:, None]
    head = kv_head * GROUP + rows
    dd = tl.arange(0, BLOCK_D)[None, :]
    o = o.to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + token * stride_ot + head * stride_oh + dd, o, mask=(rows < GROUP) & (dd < HEAD_DIM))
    if QUANT:
        width = tl.num_programs(1) * GROUP * HEAD_DIM                   # the token's row: every head
        first = kv_head * GROUP * HEAD_DIM
        store_int8_blocks(tl.reshape(o.to(tl.float32), (ROWS * BLOCK_D,)), 0, q8_ptr + token * width + first,
                          d8_ptr + (token * width + first) // 32, s8_ptr + (token * width + first) // 32,
                          GROUP * HEAD_DIM // 32, ROWS * BLOCK_D // 32, SUMS)


@triton.jit
def _attend(q, k, v, n_valid, m_i, l_i, acc, scale, softcap, USE_SOFTCAP: tl.constexpr, PRECISION: tl.constexpr):
    """One K/V tile into the online softmax: ``(m_i, l_i, acc)`` after the tile's ``n_valid`` positions (an
    empty tile leaves them as they were)."""
    s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
    if USE_SOFTCAP:
        s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap * tanh(s / softcap)
    s = tl.where(n_valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit(do_not_specialize=["stride_bt", "sliding_window"])  # block-table width changes every few steps
def split_decode_kernel(
        out_ptr, q_ptr, k_cache_ptr, v_cache_ptr, query_start_loc_ptr, seq_lens_ptr, block_tables_ptr,
        acc_part_ptr, ml_part_ptr, counts_ptr, scale, softcap, sliding_window,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
        ROWS: tl.constexpr, BLOCK_N: tl.constexpr, PAGE: tl.constexpr, SPLITS: tl.constexpr,
        USE_SOFTCAP: tl.constexpr, USE_WINDOW: tl.constexpr, PRECISION: tl.constexpr, q8_ptr=None, d8_ptr=None,
        s8_ptr=None, QUANT: tl.constexpr = False, SUMS: tl.constexpr = False, PDL: tl.constexpr = False):
    """Program (seq, kv_head, split): the GROUP query heads of kv_head (padded to GROUP_PAD >= 16 rows for
    ``tl.dot``) over slice ``split`` of the sequence's visible context, an online softmax in float32.
    A sequence without a new token (a padding row) is skipped by all its programs alike. ``QUANT``/``SUMS``: the
    combining program also writes the output's int8 blocks (``_combine``).

    ``PDL``: the slice's first K/V tile is loaded before waiting for the kernel before (``triton_pdl``), so its
    memory round trips (the batch's lengths, the block table, the tile) overlap that kernel's end. Only what no
    kernel of the step writes is read then: in a decode step the one cache position written is each sequence's
    new token (``seq_len - 1``, stored by the kernel just before, with q); it is read after the wait."""
    seq, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    q_begin = tl.load(query_start_loc_ptr + seq)
    if tl.load(query_start_loc_ptr + seq + 1) == q_begin:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    start = 0
    if USE_WINDOW:
        start = tl.maximum(seq_len - sliding_window, 0)            # the new token sits at seq_len - 1
    chunk = tl.cdiv(tl.cdiv(seq_len - start, SPLITS), BLOCK_N) * BLOCK_N
    lo = start + split * chunk
    hi = tl.minimum(lo + chunk, seq_len)

    rows = tl.arange(0, GROUP_PAD)
    head = kv_head * GROUP + rows
    row_valid = rows < GROUP
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    block_table = block_tables_ptr + seq * stride_bt
    n = lo + tl.arange(0, BLOCK_N)
    n_valid = n < hi
    block_ids, offsets = page_slots(block_table, n, n_valid, PAGE)
    old = (n_valid & (n < seq_len - 1))[:, None] & d_valid[None, :]
    k = kv_tile(k_cache_ptr, block_ids, offsets, kv_head, d, stride_kb, stride_ks, stride_kh, old)
    v = kv_tile(v_cache_ptr, block_ids, offsets, kv_head, d, stride_vb, stride_vs, stride_vh, old)
    wait_for_previous(PDL)                                          # kernels/triton_pdl
    if hi == seq_len:                                               # this slice holds the new token
        new = (n == seq_len - 1)[:, None] & d_valid[None, :]
        k += kv_tile(k_cache_ptr, block_ids, offsets, kv_head, d, stride_kb, stride_ks, stride_kh, new)
        v += kv_tile(v_cache_ptr, block_ids, offsets, kv_head, d, stride_vb, stride_vs, stride_vh, new)
    token = q_begin.to(tl.int64)
    q = tl.load(q_ptr + token * stride_qt + head[:, None] * stride_qh + d[None, :],
                mask=row_valid[:, None] & d_valid[None, :], other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, BLOCK_D], tl.float32)
    m_i, l_i, acc = _attend(q, k, v, n_valid, m_i, l_i, acc, scale, softcap, USE_SOFTCAP, PRECISION)
    for n_start in range(lo + BLOCK_N, hi, BLOCK_N):
        n = n_start + tl.arange(0, BLOCK_N)
        n_valid = n < hi
        block_ids, offsets = page_slots(block_table, n, n_valid, PAGE)
        kv_mask = n_valid[:, None] & d_valid[None, :]
        k = kv_tile(k_cache_ptr, block_ids, offsets, kv_head, d, stride_kb, stride_ks, stride_kh, kv_mask)
        # V issued with K: both wait only on the block table, so one memory round trip serves both
        v = kv_tile(v_cache_ptr, block_ids, offsets, kv_head, d, stride_vb, stride_vs, stride_vh, kv_mask)
        m_i, l_i, acc = _attend(q, k, v, n_valid, m_i, l_i, acc, scale, softcap, USE_SOFTCAP, PRECISION)

    slot = seq * tl.num_programs(1) + kv_head
    part = slot * SPLITS + split
    keep = rows < ROWS
    tl.store(acc_part_ptr + (part * ROWS + rows[:, None]) * BLOCK_D + d[None, :], acc, mask=keep[:, None])
    tl.store(ml_part_ptr + part * (2 * ROWS) + rows, m_i, mask=keep)
    tl.store(ml_part_ptr + part * (2 * ROWS) + ROWS + rows, l_i, mask=keep)
    tl.debug_barrier()             # every thread's partials are written before the counter says so
    if tl.atomic_add(counts_ptr + slot, 1, sem="acq_rel", scope="gpu") == SPLITS - 1:
        _combine(out_ptr, acc_part_ptr, ml_part_ptr, slot, token, kv_head, stride_ot, stride_oh,
                 q8_ptr, d8_ptr, s8_ptr, HEAD_DIM, BLOCK_D, GROUP, ROWS, SPLITS, QUANT, SUMS)
        tl.store(counts_ptr + slot, 0)
