"""Runtime-facing wrappers of the fused Triton kernels (same signatures as the references), each
with ``supports`` declining what the kernels do not handle (the reference then runs)."""
from __future__ import annotations

import torch
import triton

from ..triton_pdl import launch_options
from ..triton_reduce import sum_splits
from .triton_kernels import gated_activation_kernel, rms_norm_kernel, rotary_heads_kernel

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_NORM_COLS = 65536
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second dimension (one program per head)
ACTIVATION_CODES = {"silu": 0, "gelu_pytorch_tanh": 1, "gelu": 2}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _norm_warps(block: int) -> int:
    return 1 if block <= 256 else 4 if block <= 2048 else 8


def _int8_outputs(rows: int, cols: int, sums: bool | None, device) -> tuple:
    """Buffers of the int8 blocks a kernel writes with its output (``sums`` None: none; the kernel then
    reads placeholders it never touches): ``(words [rows, cols / 4] int32, scales, sums or None)``."""
    if sums is None:
        return None, None, None
    words = torch.empty(rows, cols // 4, dtype=torch.int32, device=device)
    scales = torch.empty(rows, cols // 32, dtype=torch.float32, device=device)
    return words, scales, torch.empty_like(scales) if sums else None


def _launch_norm(x, residual, weight, eps: float, weight_offset: float, sums: bool | None,
                 parts: torch.Tensor | None = None):
    """``rms_norm_kernel`` over x's rows: ``(out, total or None, words, scales, block sums)``. ``parts``: x's value
    as split-K partial sums ``[S, rows, cols]`` float32 (``kernels/split_sums``); x then gives only the shape and
    dtype."""
    flat = _rows(x)
    res = _rows(residual) if residual is not None else flat
    out = torch.empty_like(flat)
    total = torch.empty_like(flat) if residual is not None else out
    words, scales, block_sums = _int8_outputs(flat.shape[0], flat.shape[1], sums, x.device)
    block = triton.next_power_of_2(flat.shape[1])
    src = flat if parts is None else parts
    if flat.shape[0]:
        rms_norm_kernel[(flat.shape[0],)](
            src, res, weight, out, total, flat.shape[1], src.stride(-2), res.stride(0), out.stride(0),
            total.stride(0), float(eps), float(weight_offset), HAS_RESIDUAL=residual is not None,
            HAS_OFFSET=bool(weight_offset), BLOCK=block, q_ptr=None if words is None else words.view(torch.int8),
            d_ptr=scales, s_ptr=block_sums if block_sums is not None else scales, QUANT=sums is not None,
            SUMS=bool(sums), SPLITS=1 if parts is None else parts.shape[0],
            stride_split=0 if parts is None else parts.stride(0),
            # a row's partials are S times its bytes, read by the row's one program: more warps, more loads in flight
            num_warps=_norm_warps(block) if parts is None else min(16, 4 * _norm_warps(block)),
            **launch_options(x.device))
    return out.view(x.shape), (total.view(x.shape) if residual is not None else None), words, scales, block_sums


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float = 0.0) -> torch.Tensor:
    return _launch_norm(x, None, weight, eps, weight_offset, None)[0]


def _norm_supports(x, weight, eps, weight_offset=0.0) -> bool:
    return (x.is_cuda and x.dtype in DTYPES and x.shape[-1] <= MAX_NORM_COLS and x.stride(-1) == 1
            and weight.is_cuda and weight.dim() == 1 and weight.shape[0] == x.shape[-1] and weight.is_contiguous()
            and (bool(weight_offset) or weight.dtype == x.dtype))  # else the reference promotes the dtype


rms_norm.supports = _norm_supports


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                 weight_offset: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch_norm(x, residual, weight, eps, weight_offset, None)[:2]


def _add_norm_supports(x, residual, weight, eps, weight_offset=0.0) -> bool:
    return (_norm_supports(x, weight, eps, weight_offset) and residual.shape == x.shape and residual.dtype == x.dtype
            and residual.is_cuda and residual.stride(-1) == 1)


add_rms_norm.supports = _add_norm_supports


def rms_norm_int8(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float, sums: bool):
    """``rms_norm`` and its output's int8 blocks in one kernel: ``(out, words, scales, sums or None)``."""
    out, _, words, scales, block_sums = _launch_norm(x, None, weight, eps, weight_offset, sums)
    return out, words, scales, block_sums


rms_norm_int8.supports = lambda x, weight, eps, weight_offset, sums: (
    _norm_supports(x, weight, eps, weight_offset) and x.shape[-1] % 32 == 0)


def add_rms_norm_int8(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                      weight_offset: float, sums: bool):
    """``add_rms_norm`` and the normalised output's int8 blocks in one kernel:
    ``(out, total, words, scales, sums or None)``."""
    return _launch_norm(x, residual, weight, eps, weight_offset, sums)


add_rms_norm_int8.supports = lambda x, residual, weight, eps, weight_offset, sums: (
    _add_norm_supports(x, residual, weight, eps, weight_offset) and x.shape[-1] % 32 == 0)


def _parts_ok(parts: torch.Tensor, shape) -> bool:
    """Split-K partials ``[S, T, N]`` the kernels read in place: float32, rows of contiguous columns."""
    return (parts.is_cuda and parts.dtype == torch.float32 and parts.dim() == 3 and tuple(parts.shape[1:]) == shape
            and parts.stride(-1) == 1)


def add_rms_norm_splits(parts: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        weight_offset: float, sums: bool | None):
    """The reference's ``add_rms_norm_splits`` in one kernel: the partials added as the norm loads its input."""
    return _launch_norm(residual, residual, weight, eps, weight_offset, sums, parts)


add_rms_norm_splits.supports = lambda parts, residual, weight, eps, weight_offset, sums: (
    _parts_ok(parts, tuple(residual.shape)) and residual.dim() == 2
    and _add_norm_supports(residual, residual, weight, eps, weight_offset)
    and (sums is None or residual.shape[-1] % 32 == 0))


def _rotary_config(head_dim: int, rotary_dim: int) -> dict:
    half, passthrough = rotary_dim // 2, head_dim - rotary_dim
    return dict(HEAD_DIM=head_dim, HALF=half, BLOCK_HALF=triton.next_power_of_2(half), PASS=passthrough,
                BLOCK_PASS=triton.next_power_of_2(max(passthrough, 1)), BLOCK_D=triton.next_power_of_2(head_dim),
                num_warps=1)  # one head per program: 32 threads cover a half of up to 128 features in 4 loads


def rotary_qk(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, inv_freq: torch.Tensor, head_dim: int,
              rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = q.shape[0]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)   # contiguous even when q is a view
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    q_heads, k_heads = q.shape[1] // head_dim, k.shape[1] // head_dim
    if tokens:
        # k's destination as a one-slot-per-token "cache": slot t, PAGE 1, heads head_dim apart
        rotary_heads_kernel[(tokens, q_heads + k_heads)](
            positions, inv_freq, positions, q, k, k, q_out, k_out, k_out, q_heads, q.stride(0), k.stride(0),
            k.stride(0), q_out.stride(0), k_out.stride(0), 0, head_dim, 0, 0, 0, inv_freq, inv_freq, 0.0, 0.0,
            PAGE=1, STORE_KV=False,
            **_rotary_config(head_dim, rotary_dim), **launch_options(q.device))
    return q_out, k_out


def _rotary_supports(positions, q, k, inv_freq, head_dim, rotary_dim) -> bool:
    return (q.is_cuda and q.dtype in DTYPES and k.dtype == q.dtype and q.dim() == 2 and k.dim() == 2
            and q.stride(1) == 1 and k.stride(1) == 1 and positions.is_cuda and positions.dim() == 1
            and positions.shape[0] == q.shape[0] == k.shape[0] and inv_freq.is_cuda and inv_freq.is_floating_point()
            and inv_freq.is_contiguous() and rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim
            and inv_freq.shape[0] == rotary_dim // 2 and q.shape[1] % head_dim == 0 and k.shape[1] % head_dim == 0
            and q.shape[1] // head_dim + k.shape[1] // head_dim <= MAX_GRID_Y)


rotary_qk.supports = _rotary_supports


def _rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     inv_freq: torch.Tensor, head_dim: int, rotary_dim: int, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The reference's ``rotary_store_kv`` in one kernel: rotated q returned, rotated k and v stored."""
    return _launch_store(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping, None)


def _launch_store(positions, q, k, v, inv_freq, head_dim: int, rotary_dim: int, k_cache, v_cache, slot_mapping,
                  norm: tuple | None, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``rotary_heads_kernel`` storing into the paged caches; ``norm``: (q_weight, k_weight, eps,
    weight_offset) RMS-normalises every q and k head first. With ``dtype``, q, k and v are partial sums
    ``[S, T, N]`` (``split_sums.as_parts``: S = 1 holds the value in ``dtype``) whose totals are the inputs."""
    if dtype is None:
        q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        dtype = q.dtype
    tokens = q.shape[1]
    q_out = torch.empty(q.shape[1:], dtype=dtype, device=q.device)
    q_heads, kv_heads = q.shape[2] // head_dim, k.shape[2] // head_dim
    q_weight, k_weight, eps, offset = norm if norm is not None else (inv_freq, inv_freq, 0.0, 0.0)  # unread without
    if tokens:
        rotary_heads_kernel[(tokens, q_heads + kv_heads)](
            positions, inv_freq, slot_mapping, q, k, v, q_out, k_cache, v_cache, q_heads, q.stride(1), k.stride(1),
            v.stride(1), q_out.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0),
            v_cache.stride(1), v_cache.stride(2), q_weight, k_weight, float(eps), float(offset),
            PAGE=k_cache.shape[1], STORE_KV=True, NORM=norm is not None, HAS_OFFSET=bool(offset),
            Q_SPLITS=q.shape[0], K_SPLITS=k.shape[0], V_SPLITS=v.shape[0], split_q=q.stride(0), split_k=k.stride(0),
            split_v=v.stride(0), **_rotary_config(head_dim, rotary_dim), **launch_options(q.device))
    return q_out


rotary_store_kv_op = torch.library.custom_op("toolkit::rotary_store_kv",
                                             mutates_args=("k_cache", "v_cache"))(_rotary_store_kv)


@rotary_store_kv_op.register_fake
def _(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping):
    return torch.empty(q.shape, dtype=q.dtype, device=q.device)


def rotary_store_kv(positions, q, k, v, inv_freq, head_dim: int, rotary_dim: int, k_cache, v_cache,
                    slot_mapping) -> torch.Tensor:
    # the custom op (mutating the caches) only under torch.compile: its dispatcher costs host time per call
    op = torch.ops.toolkit.rotary_store_kv if torch.compiler.is_compiling() else _rotary_store_kv
    return op(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping)


def _rotary_store_kv_supports(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                              slot_mapping) -> bool:
    kv_shape = (k.shape[1] // head_dim, head_dim)
    return (_rotary_supports(positions, q, k, inv_freq, head_dim, rotary_dim) and v.is_cuda and v.dtype == k.dtype
            and v.shape == k.shape and v.stride(1) == 1 and k_cache.is_cuda and k_cache.dim() == 4
            and v_cache.dim() == 4 and tuple(k_cache.shape[2:]) == kv_shape and tuple(v_cache.shape[2:]) == kv_shape
            and k_cache.shape[:2] == v_cache.shape[:2] and k_cache.stride(3) == 1 and v_cache.stride(3) == 1
            and k_cache.dtype in DTYPES and v_cache.dtype in DTYPES and slot_mapping.is_cuda
            and slot_mapping.dim() == 1 and slot_mapping.shape[0] == q.shape[0] and not slot_mapping.is_floating_point())


rotary_store_kv.supports = _rotary_store_kv_supports


def qk_norm_rotary_store_kv(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            q_weight: torch.Tensor, k_weight: torch.Tensor, eps: float, weight_offset: float,
                            inv_freq: torch.Tensor, head_dim: int, rotary_dim: int, k_cache: torch.Tensor,
                            v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> torch.Tensor:
    """The reference's ``qk_norm_rotary_store_kv`` in one kernel: each q and k head RMS-normalised, then
    rotated; rotated q returned, rotated k and v stored. q and k are read where they lie (views of the
    fused qkv output), so the two norm launches and the copies their reshapes made are gone."""
    return _launch_store(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping,
                         (q_weight, k_weight, eps, weight_offset))


def _qk_norm_supports(positions, q, k, v, q_weight, k_weight, eps, weight_offset, inv_freq, head_dim, rotary_dim,
                      k_cache, v_cache, slot_mapping) -> bool:
    # under torch.compile the reference's composition runs (its parts are custom ops that declare the cache writes)
    return (not torch.compiler.is_compiling()
            and _rotary_store_kv_supports(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                                          slot_mapping)
            and all(w.is_cuda and w.dim() == 1 and w.shape[0] == head_dim and w.is_contiguous()
                    and (bool(weight_offset) or w.dtype == q.dtype) for w in (q_weight, k_weight)))


qk_norm_rotary_store_kv.supports = _qk_norm_supports


def rotary_store_kv_splits(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           dtype: torch.dtype, inv_freq: torch.Tensor, head_dim: int, rotary_dim: int,
                           k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor,
                           norm: tuple | None) -> torch.Tensor:
    """The reference's ``rotary_store_kv_splits`` in one kernel: each head's partials added as they load, then
    (``norm``) RMS-normalised and rotated; rotated q returned, rotated k and v stored."""
    return _launch_store(positions, q, k, v, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping, norm,
                         dtype)


def _splits_store_supports(positions, q, k, v, dtype, inv_freq, head_dim, rotary_dim, k_cache, v_cache, slot_mapping,
                           norm) -> bool:
    # each input: float32 partials, or its value in dtype (S = 1); the rest as the one-tensor ops check it
    parts_ok = all(x.is_cuda and x.dim() == 3 and x.stride(-1) == 1 and x.shape[1] == q.shape[1]
                   and x.dtype == (dtype if x.shape[0] == 1 else torch.float32) for x in (q, k, v))
    if not parts_ok:
        return False
    # what those checks read of a summed input (device, shape, dtype, unit column stride) as a view in dtype: no copy
    values = [x[0] if x.shape[0] == 1 else x[0].view(dtype)[:, :x.shape[2]] for x in (q, k, v)]
    if norm is None:
        return _rotary_store_kv_supports(positions, *values, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                                         slot_mapping)
    return _qk_norm_supports(positions, *values, *norm, inv_freq, head_dim, rotary_dim, k_cache, v_cache,
                             slot_mapping)


rotary_store_kv_splits.supports = _splits_store_supports


def _launch_gated(x: torch.Tensor, activation: str, sums: bool | None, dtype: torch.dtype | None = None):
    """``gated_activation_kernel`` over x's rows: ``(out, words, scales, block sums)``. With ``dtype``, x holds
    split-K partial sums ``[S, rows, 2 cols]`` float32 (``kernels/split_sums``) whose total, in ``dtype``, is the
    input."""
    splits = 1 if dtype is None else x.shape[0]
    flat = _rows(x) if dtype is None else x
    shape = x.shape[:-1] if dtype is None else x.shape[1:-1]
    rows, cols = flat.shape[-2], flat.shape[-1] // 2
    out = torch.empty(rows, cols, dtype=dtype or x.dtype, device=x.device)
    words, scales, block_sums = _int8_outputs(rows, cols, sums, x.device)
    block = min(1024, triton.next_power_of_2(cols))
    if rows:
        gated_activation_kernel[(rows, triton.cdiv(cols, block))](
            flat, out, cols, flat.stride(-2), out.stride(0), ACT=ACTIVATION_CODES[activation], BLOCK=block,
            q_ptr=None if words is None else words.view(torch.int8), d_ptr=scales,
            s_ptr=block_sums if block_sums is not None else scales, QUANT=sums is not None, SUMS=bool(sums),
            SPLITS=splits, stride_split=flat.stride(0) if splits > 1 else 0, num_warps=4, **launch_options(x.device))
    return out.view(*shape, cols), words, scales, block_sums


def gated_activation(x: torch.Tensor, activation: str) -> torch.Tensor:
    return _launch_gated(x, activation, None)[0]


gated_activation.supports = lambda x, activation: (
    x.is_cuda and x.dtype in DTYPES and activation in ACTIVATION_CODES and x.shape[-1] % 2 == 0
    and x.stride(-1) == 1 and x.reshape(-1, x.shape[-1]).stride(-1) == 1)


def gated_activation_int8(x: torch.Tensor, activation: str, sums: bool):
    """``gated_activation`` and its output's int8 blocks in one kernel: ``(out, words, scales, sums or None)``."""
    return _launch_gated(x, activation, sums)


gated_activation_int8.supports = lambda x, activation, sums: (
    gated_activation.supports(x, activation) and x.shape[-1] % 64 == 0)


def gated_activation_splits(parts: torch.Tensor, dtype: torch.dtype, activation: str, sums: bool | None):
    """The reference's ``gated_activation_splits`` in one kernel: the partials added as the kernel loads them."""
    return _launch_gated(parts, activation, sums, dtype)


gated_activation_splits.supports = lambda parts, dtype, activation, sums: (
    _parts_ok(parts, tuple(parts.shape[1:])) and dtype in DTYPES and activation in ACTIVATION_CODES
    and parts.shape[-1] % (2 if sums is None else 64) == 0)

OPS = {"rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "rotary_qk": rotary_qk,
       "rotary_store_kv": rotary_store_kv, "qk_norm_rotary_store_kv": qk_norm_rotary_store_kv,
       "gated_activation": gated_activation, "rms_norm_int8": rms_norm_int8, "add_rms_norm_int8": add_rms_norm_int8,
       "gated_activation_int8": gated_activation_int8, "sum_splits": sum_splits,
       "add_rms_norm_splits": add_rms_norm_splits, "gated_activation_splits": gated_activation_splits,
       "rotary_store_kv_splits": rotary_store_kv_splits}
