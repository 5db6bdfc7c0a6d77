"""Python side of ``cpu_fused.cpp``: argument checks (``supports``) and the calls.

Each op computes what its torch reference in ``kernels/reference.py`` computes, for float32 CPU
tensors, in one compiled pass; ``supports`` declines anything else (another dtype or device, an
unknown activation, a layout the kernel does not take) and the runtime then runs the reference.
Results equal the references up to float32 rounding (summation order, libm's cos/sin/tanh).
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..gguf_cpu.build import Extension

HERE = Path(__file__).parent
EXTENSION = Extension("toolkit_cpu_fused", [HERE / "cpu_fused.cpp"], [], "CPU fused decoder-layer kernels")
ACTIVATIONS = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu": 2}
_F32 = torch.float32


def _cpu_f32(*tensors) -> bool:
    for t in tensors:  # a plain loop: these checks run ~250 times per decode token
        if not isinstance(t, torch.Tensor) or t.dtype != _F32 or t.device.type != "cpu":
            return False
    return True


def _built() -> bool:
    return EXTENSION.ready()


# ---- RMSNorm ----------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.shape[-1]
    EXTENSION.get().rms_norm(x.data_ptr(), weight.data_ptr(), out.data_ptr(), x.numel() // n, n, eps, weight_offset)
    return out


def add_rms_norm(x, residual, weight, eps, weight_offset=0.0):
    x, residual = x.contiguous(), residual.contiguous()
    out, total = torch.empty_like(x), torch.empty_like(x)
    n = x.shape[-1]
    EXTENSION.get().add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), out.data_ptr(),
                                  total.data_ptr(), x.numel() // n, n, eps, weight_offset)
    return out, total


def _supports_norm(x, weight, *args, **kwargs) -> bool:
    return (_cpu_f32(x, weight) and weight.is_contiguous() and weight.numel() == x.shape[-1] and x.numel() > 0
            and _built())


def _supports_add_norm(x, residual, weight, *args, **kwargs) -> bool:
    return _supports_norm(x, weight) and _cpu_f32(residual) and residual.shape == x.shape


# ---- rotary -----------------------------------------------------------------------------------
def rotary_qk(positions, q, k, inv_freq, head_dim: int, rotary_dim: int):
    tokens = q.shape[0]
    q_out = torch.empty(tokens, q.shape[1], dtype=_F32)
    k_out = torch.empty(tokens, k.shape[1], dtype=_F32)
    EXTENSION.get().rotary_qk(positions.data_ptr(), q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0),
                               inv_freq.data_ptr(), q_out.data_ptr(), k_out.data_ptr(), tokens,
                               q.shape[1] // head_dim, k.shape[1] // head_dim, head_dim, rotary_dim)
    return q_out, k_out


def _supports_rotary(positions, q, k, inv_freq, head_dim, rotary_dim, *args, **kwargs) -> bool:
    return (_cpu_f32(q, k, inv_freq) and isinstance(positions, torch.Tensor) and positions.dtype == torch.int64
            and positions.device.type == "cpu" and positions.is_contiguous() and positions.dim() == 1
            and q.dim() == 2 and k.dim() == 2 and q.stride(1) == 1 and k.stride(1) == 1
            and q.shape[0] == k.shape[0] == positions.shape[0] and inv_freq.is_contiguous()
            and rotary_dim % 2 == 0 and inv_freq.numel() == rotary_dim // 2 and rotary_dim <= head_dim
            and q.shape[1] % head_dim == 0 and k.shape[1] % head_dim == 0 and _built())


# ---- gated activation ---------------------------------------------------------------------------
def gated_activation(x: torch.Tensor, activation: str) -> torch.Tensor:
    x = x.contiguous()
    width = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], width, dtype=_F32)
    EXTENSION.get().gated_activation(x.data_ptr(), out.data_ptr(), x.numel() // (2 * width), width,
                                      ACTIVATIONS[activation])
    return out


def _supports_gated(x, activation, *args, **kwargs) -> bool:
    return _cpu_f32(x) and activation in ACTIVATIONS and x.shape[-1] % 2 == 0 and x.numel() > 0 and _built()


# ---- KV cache and attention ---------------------------------------------------------------------
def _rows_dense(t: torch.Tensor) -> bool:
    """[T, heads, dim] whose (heads, dim) block is dense (rows may have a stride: a slice of qkv)."""
    return t.dim() == 3 and t.stride(2) == 1 and t.stride(1) == t.shape[2]


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    width = k.shape[1] * k.shape[2]
    EXTENSION.get().store_kv(k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), k_cache.data_ptr(),
                              v_cache.data_ptr(), slot_mapping.data_ptr(), k.shape[0], width)


def _supports_store(k, v, k_cache, v_cache, slot_mapping, *args, **kwargs) -> bool:
    return (_cpu_f32(k, v, k_cache, v_cache) and _rows_dense(k) and _rows_dense(v) and k.shape == v.shape
            and k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape == v_cache.shape
            and tuple(k_cache.shape[2:]) == tuple(k.shape[1:]) and isinstance(slot_mapping, torch.Tensor)
            and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
            and slot_mapping.shape == (k.shape[0],) and _built())


def paged_attention(q, k_cache, v_cache, attn, scale: float, sliding_window=None, softcap=None) -> torch.Tensor:
    q = q.contiguous()
    out = torch.empty_like(q)
    tokens, heads, dim = q.shape
    tables = attn.block_tables
    starts = attn.query_start_loc if attn.query_start_loc.dtype == torch.int32 else attn.query_start_loc.int()
    lens = attn.seq_lens if attn.seq_lens.dtype == torch.int32 else attn.seq_lens.int()
    EXTENSION.get().paged_attention(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(), starts.data_ptr(), lens.data_ptr(),
        tables.data_ptr(), tables.stride(0), tables.dtype == torch.int64, lens.shape[0], tokens, heads,
        k_cache.shape[2], dim, k_cache.shape[1], float(scale), int(sliding_window or 0), float(softcap or 0.0))
    return out


def _supports_paged(q, k_cache, v_cache, attn, *args, **kwargs) -> bool:
    tables = attn.block_tables
    return (_cpu_f32(q, k_cache, v_cache) and q.dim() == 3 and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.shape == v_cache.shape and k_cache.shape[3] == q.shape[2]
            and q.shape[1] % k_cache.shape[2] == 0 and tables is not None
            and tables.dtype in (torch.int32, torch.int64) and tables.stride(1) == 1
            and attn.query_start_loc.is_contiguous() and attn.seq_lens.is_contiguous() and _built())


def rotary_store_kv(positions, q, k, v, inv_freq, head_dim: int, rotary_dim: int, k_cache, v_cache, slot_mapping):
    """The two compiled passes (rotary, then the store) the reference ``rotary_store_kv`` names."""
    q_rot, k_rot = rotary_qk(positions, q, k, inv_freq, head_dim, rotary_dim)
    store_kv(k_rot.view(k.shape[0], -1, head_dim), v.view(v.shape[0], -1, head_dim), k_cache, v_cache, slot_mapping)
    return q_rot


def _supports_rotary_store(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping,
                           *args, **kwargs) -> bool:
    if not (_supports_rotary(positions, q, k, inv_freq, head_dim, rotary_dim) and _cpu_f32(v) and v.dim() == 2
            and v.shape == k.shape and v.stride(1) == 1):
        return False
    # rotary_qk's k output is dense and v's rows are dense (stride 1): the store's layout checks hold for
    # both, leaving the caches and the slots
    kv_shape = (k.shape[1] // head_dim, head_dim)
    return (_cpu_f32(k_cache, v_cache) and k_cache.is_contiguous() and v_cache.is_contiguous()
            and k_cache.shape == v_cache.shape and tuple(k_cache.shape[2:]) == kv_shape
            and isinstance(slot_mapping, torch.Tensor) and slot_mapping.dtype == torch.int64
            and slot_mapping.is_contiguous() and slot_mapping.shape == (k.shape[0],))


rms_norm.supports = _supports_norm
add_rms_norm.supports = _supports_add_norm
rotary_qk.supports = _supports_rotary
rotary_store_kv.supports = _supports_rotary_store
gated_activation.supports = _supports_gated
store_kv.supports = _supports_store
paged_attention.supports = _supports_paged

OPS = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "rotary_qk": rotary_qk, "rotary_store_kv": rotary_store_kv,
       "gated_activation": gated_activation, "store_kv": store_kv, "paged_attention": paged_attention}
