"""The Triton kernels as torch custom ops, plus the runtime-facing wrappers and their ``supports``."""
from __future__ import annotations

import torch
import triton

from ..triton_pdl import launch_options
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


def _paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, query_start_loc: torch.Tensor,
                     seq_lens: torch.Tensor, block_tables: torch.Tensor, max_query_len: int, scale: float,
                     sliding_window: int, softcap: float) -> torch.Tensor:
    """q [T, H, D] attends over each sequence's paged KV; ``sliding_window``/``softcap`` 0 mean off."""
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_seqs, (_, num_heads, head_dim) = seq_lens.shape[0], q.shape
    num_kv_heads = k_cache.shape[2]
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


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    op = torch.ops.toolkit.store_kv if torch.compiler.is_compiling() else _store_kv
    op(k, v, k_cache, v_cache, slot_mapping)


def _store_kv_supports(k, v, k_cache, v_cache, slot_mapping) -> bool:
    return (k.is_cuda and k.stride(-1) == 1 and v.stride(-1) == 1 and k_cache.stride(-1) == 1
            and k.shape[-1] <= MAX_HEAD_DIM and k.dtype in DTYPES)


store_kv.supports = _store_kv_supports


OPS = {"paged_attention": paged_attention, "store_kv": store_kv}  # what __init__ registers, lazily
