"""The Triton kernels as torch custom ops, plus the runtime-facing wrappers and their ``supports``."""
from __future__ import annotations

import os

import torch
import triton

from ..launch import num_sms
from ..triton_pdl import launch_options
from .triton_decode import split_decode_kernel
from .triton_kernels import paged_attention_kernel, store_kv_kernel

MAX_HEAD_DIM = 256
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _launch_config(group: int, head_dim: int, max_query_len: int) -> dict:
    """Decode: one query token x the head group per program; prefill: ~64 rows of queries x heads."""
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs K >= 16
    group_pad = triton.next_power_of_2(group)
    block_q = 1 if max_query_len == 1 else max(1, 64 // group_pad)
    group_pad = max(group_pad, 16 // block_q)  # tl.dot needs at least 16 rows
    block_n = 64 if block_d <= 128 else 32
    return dict(BLOCK_D=block_d, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_N=block_n,
                num_warps=4 if block_d <= 128 else 8)


# Split-context decode (triton_decode): programs per SM it aims at, the most slices per (sequence, kv head),
# and the most float32 partials (slices x head-group rows x head dim) the combining program holds at once.
DECODE_PROGRAMS_PER_SM = 2
MAX_DECODE_SPLITS = 16
MAX_COMBINED = 8192
DECODE_BLOCK_N = 32


def decode_splits(num_seqs: int, num_kv_heads: int, group: int, head_dim: int, device: torch.device) -> int:
    """Slices of the context per (sequence, kv head) for a decode step: a power of two, enough that the step
    runs about ``DECODE_PROGRAMS_PER_SM`` programs per SM; 1 (the one-program kernel) once the sequences
    alone fill the GPU. Depends on the batch's shape only, never its lengths, so a CUDA graph keeps it.
    ``TOOLKIT_DECODE_SPLITS=N`` sets the most slices instead (a power of two; 1 turns splitting off)."""
    wanted = int(os.environ.get("TOOLKIT_DECODE_SPLITS", MAX_DECODE_SPLITS))
    programs = max(1, num_seqs * num_kv_heads)
    splits = min(wanted, DECODE_PROGRAMS_PER_SM * num_sms(device) // programs)
    rows = triton.next_power_of_2(group) * max(16, triton.next_power_of_2(head_dim))
    while splits > 1 and splits * rows > MAX_COMBINED:
        splits //= 2
    return 1 if splits < 2 else 2 ** (splits.bit_length() - 1)


_COUNTS: dict[torch.device, torch.Tensor] = {}


def _step_splits(q: torch.Tensor, k_cache: torch.Tensor, num_seqs: int, max_query_len: int) -> int:
    """``decode_splits`` for this step's q [T, H, D] and cache; 1 unless every sequence has one new token."""
    if max_query_len != 1:
        return 1
    num_heads, num_kv_heads = q.shape[1], k_cache.shape[2]
    return decode_splits(num_seqs, num_kv_heads, num_heads // num_kv_heads, q.shape[2], q.device)


def _decode_counts(device: torch.device, slots: int) -> torch.Tensor | None:
    """The zeroed counters of ``split_decode_kernel`` (each combining program zeroes its own again), made
    once per device outside graph capture; None while capturing before they exist (then no split)."""
    counts = _COUNTS.get(device)
    if counts is None or counts.numel() < slots:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = _COUNTS[device] = torch.zeros(max(slots, 1024), dtype=torch.int32, device=device)
    return counts


def _split_decode(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window, softcap,
                  splits: int, blocks: tuple | None = None) -> torch.Tensor | None:
    """``_paged_attention`` for one new token per sequence, the context cut into ``splits`` slices (None: the
    counters are not there yet). ``blocks``: ``(words, scales, sums or None)`` the kernel fills with the output's
    int8 blocks (``_combine``)."""
    num_seqs, (_, num_heads, head_dim) = seq_lens.shape[0], q.shape
    num_kv_heads = k_cache.shape[2]
    counts = _decode_counts(q.device, num_seqs * num_kv_heads)
    if counts is None:
        return None
    group = num_heads // num_kv_heads
    rows, block_d = triton.next_power_of_2(group), max(16, triton.next_power_of_2(head_dim))
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    acc_part = torch.empty(num_seqs * num_kv_heads, splits, rows, block_d, dtype=torch.float32, device=q.device)
    ml_part = torch.empty(num_seqs * num_kv_heads, splits, 2, rows, dtype=torch.float32, device=q.device)
    split_decode_kernel[(num_seqs, num_kv_heads, splits)](
        out, q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, acc_part, ml_part, counts,
        scale, softcap, sliding_window, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=head_dim, BLOCK_D=block_d, GROUP=group, GROUP_PAD=max(16, rows), ROWS=rows,
        BLOCK_N=DECODE_BLOCK_N, PAGE=k_cache.shape[1], SPLITS=splits, USE_SOFTCAP=softcap > 0,
        USE_WINDOW=sliding_window > 0, PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
        num_warps=4, **_int8_arguments(blocks), **launch_options(q.device))
    return out


def _int8_arguments(blocks: tuple | None) -> dict:
    if blocks is None:
        return {}
    words, scales, sums = blocks
    return dict(q8_ptr=words.view(torch.int8), d8_ptr=scales, s8_ptr=scales if sums is None else sums, QUANT=True,
                SUMS=sums is not None)


def _paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, block_tables: torch.Tensor, max_query_len: int, scale: float,
                     sliding_window: int, softcap: float) -> torch.Tensor:
    """q [T, H, D] attends over each sequence's paged KV; ``sliding_window``/``softcap`` 0 mean off."""
    num_seqs, (_, num_heads, head_dim) = seq_lens.shape[0], q.shape
    num_kv_heads = k_cache.shape[2]
    splits = _step_splits(q, k_cache, num_seqs, max_query_len)
    if splits > 1:
        out = _split_decode(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, sliding_window,
                            softcap, splits)
        if out is not None:
            return out
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    config = _launch_config(num_heads // num_kv_heads, head_dim, max_query_len)
    grid = (num_seqs, num_kv_heads, triton.cdiv(max_query_len, config["BLOCK_Q"]))
    paged_attention_kernel[grid](
        out, q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, scale, softcap, sliding_window,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), block_tables.stride(0),
        HEAD_DIM=head_dim, GROUP=num_heads // num_kv_heads, PAGE=k_cache.shape[1], USE_SOFTCAP=softcap > 0,
        USE_WINDOW=sliding_window > 0, PRECISION="ieee" if q.dtype == torch.float32 else "tf32", **config,
        **launch_options(q.device))
    return out


paged_attention_op = torch.library.custom_op("toolkit::paged_attention", mutates_args=())(_paged_attention)


@paged_attention_op.register_fake
def _(q, k_cache, v_cache, query_start_loc, seq_lens, block_tables, max_query_len, scale, sliding_window, softcap):
    return torch.empty_like(q)


def _store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
              slot_mapping: torch.Tensor) -> None:
    """Write k/v [T, KVH, D] into the caches at ``slot_mapping`` (negative slots are skipped)."""
    tokens, num_kv_heads, head_dim = k.shape
    if tokens == 0:
        return
    store_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        PAGE=k_cache.shape[1])


store_kv_op = torch.library.custom_op("toolkit::store_kv", mutates_args=("k_cache", "v_cache"))(_store_kv)


@store_kv_op.register_fake
def _(k, v, k_cache, v_cache, slot_mapping):
    return None


# ---- what the kernel runtime calls (same signatures as the references) ---------------------------
# Outside torch.compile the wrappers launch the kernels directly: the custom-op dispatcher costs
# ~0.1-0.2 ms of host time per call, which an eager prefill (one call per layer) pays in full.
def paged_attention(q, k_cache, v_cache, attn, scale: float, sliding_window=None, softcap=None) -> torch.Tensor:
    op = torch.ops.toolkit.paged_attention if torch.compiler.is_compiling() else _paged_attention
    return op(q, k_cache, v_cache, attn.query_start_loc, attn.seq_lens, attn.block_tables, int(attn.max_query_len),
              float(scale), int(sliding_window or 0), float(softcap or 0.0))


def _paged_attention_supports(q, k_cache, v_cache, attn, *args, **kwargs) -> bool:
    return (q.is_cuda and q.dtype in DTYPES and k_cache.dtype == q.dtype and q.shape[-1] <= MAX_HEAD_DIM
            and q.stride(-1) == 1 and k_cache.stride(-1) == 1 and attn.block_tables is not None
            and q.shape[1] % k_cache.shape[2] == 0 and attn.max_query_len >= 1)


paged_attention.supports = _paged_attention_supports


def paged_attention_int8(q, k_cache, v_cache, attn, scale: float, sliding_window, softcap, sums: bool):
    """``paged_attention`` and, where the split decode kernel runs, its output's int8 blocks written by the same
    kernel (``kernels/int8_blocks.py``): ``(out, words, scales, block sums)``; the blocks are None elsewhere (a
    prefill, a batch the one-program kernel serves, a head size not a power of two), and the reader rounds."""
    tokens, num_heads, head_dim = q.shape
    if not torch.compiler.is_compiling() and head_dim >= 32 and head_dim & (head_dim - 1) == 0:
        splits = _step_splits(q, k_cache, attn.num_seqs, int(attn.max_query_len))
        if splits > 1:
            width = num_heads * head_dim
            blocks = (torch.empty(tokens, width // 4, dtype=torch.int32, device=q.device),
                      torch.empty(tokens, width // 32, dtype=torch.float32, device=q.device),
                      torch.empty(tokens, width // 32, dtype=torch.float32, device=q.device) if sums else None)
            out = _split_decode(q, k_cache, v_cache, attn.query_start_loc, attn.seq_lens, attn.block_tables,
                                float(scale), int(sliding_window or 0), float(softcap or 0.0), splits, blocks)
            if out is not None:
                return (out, *blocks)
    return paged_attention(q, k_cache, v_cache, attn, scale, sliding_window, softcap), None, None, None


paged_attention_int8.supports = lambda q, k_cache, v_cache, attn, *args: _paged_attention_supports(
    q, k_cache, v_cache, attn)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    op = torch.ops.toolkit.store_kv if torch.compiler.is_compiling() else _store_kv
    op(k, v, k_cache, v_cache, slot_mapping)


def _store_kv_supports(k, v, k_cache, v_cache, slot_mapping) -> bool:
    return (k.is_cuda and k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
            and k.shape[-1] <= MAX_HEAD_DIM and k.dtype in DTYPES)


store_kv.supports = _store_kv_supports


OPS = {"paged_attention": paged_attention, "paged_attention_int8": paged_attention_int8,
       "store_kv": store_kv}  # what __init__ registers, lazily
