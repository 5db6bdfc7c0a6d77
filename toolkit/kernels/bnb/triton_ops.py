"""CUDA implementations of ``bnb_4bit_matmul`` and ``bnb_int8_matmul`` on the Triton kernels, for
1..``SMALL_BATCH_MAX_TOKENS`` tokens (decode); larger calls and anything the kernels do not handle
are declined by ``supports`` and run bitsandbytes' own path (the op's reference).

What is declined: float32 activations (the schemes compute in the model's fp16/bf16), CPU tensors,
4-bit blocks that straddle rows (``K % blocksize``) or rows not a whole number of 32-bit words,
non-contiguous or misaligned packed data, int8 rows not 4-byte aligned.

Launch shapes (``MatmulConfig``) are chosen by reasoning about a memory-bound GEMV, the way the GGUF
kernels' measured ones came out (``kernels/gguf/triton_ops.py``): decode takes many small programs
(8 rows each) with wide K steps (512 columns: 256 bytes of 4-bit or 512 of int8 per row in flight);
2..16 tokens take ``tl.dot`` tiles of 16 tokens x 64 rows x 128 columns; K is split (``kernels/launch.py``) while there are
fewer programs than SMs. ``bench/bench_bnb_kernels.py --sweep`` times alternatives on a GPU.

``TOOLKIT_BNB_TRITON=0`` makes both decline (bitsandbytes runs everything; call
``runtime.invalidate()`` after changing it in a running process, as the runtime caches choices).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from ..launch import split_k
from . import SMALL_BATCH_MAX_TOKENS
from .triton_kernels import int8_matmul_kernel, nf4_matmul_kernel


@dataclass(frozen=True)
class MatmulConfig:
    """One launch shape: ``bm`` tokens x ``bn`` rows per program, ``bk`` columns per K step; ``dot``:
    ``tl.dot`` for ``bm > 1`` (else float32 multiply-accumulate per token; ``bm`` >= 16 with it)."""
    bm: int
    bn: int
    bk: int
    num_warps: int = 4
    num_stages: int = 2
    dot: bool = True


DECODE_CONFIG = MatmulConfig(bm=1, bn=8, bk=512)
SMALL_BATCH_CONFIG = MatmulConfig(bm=16, bn=64, bk=128)
FOUR_BIT_TYPES = ("nf4", "fp4")


def enabled() -> bool:
    return os.environ.get("TOOLKIT_BNB_TRITON", "1") != "0"


def fourbit_enabled() -> bool:
    """The 4-bit kernel is opt-in (``TOOLKIT_BNB_TRITON_4BIT=1``): on an H100 (bench_bnb_kernels.py,
    TinyLlama shapes, CUDA graphs) it lost to bitsandbytes' own path at every shape, 6.7-19.6 against
    4.3-11.1 us at one token (bitsandbytes' gemv_4bit) and 14-92 against 12-44 us at eight
    (bitsandbytes' dequantize + cuBLAS); its per-code table lookups cost more than the bytes saved.
    It stays correct and tested, for the next attempt (a 256-entry byte table, wider loads)."""
    return os.environ.get("TOOLKIT_BNB_TRITON_4BIT", "0") == "1"


def default_config(tokens: int) -> MatmulConfig:
    return DECODE_CONFIG if tokens == 1 else SMALL_BATCH_CONFIG


def _tile_width(cols: int, wanted: int, unit: int) -> int:
    """The widest power-of-two multiple of ``unit`` <= max(wanted, unit) dividing ``cols``, or 0."""
    width = max(wanted, unit)
    while width >= unit and cols % width:
        width //= 2
    return width if width >= unit else 0


def _launch(kernel, x: torch.Tensor, rows: int, cols: int, bk: int, config: MatmulConfig, split: int | None,
            args: tuple, strides: tuple, **constants) -> torch.Tensor:
    """Run ``kernel`` over (row tiles, token tiles, K splits); ``[T, rows]`` in x's dtype."""
    tokens = x.shape[0]
    grid_nm = (triton.cdiv(rows, config.bn), triton.cdiv(tokens, config.bm))
    if split is None:
        split = split_k(grid_nm[0] * grid_nm[1], cols // bk, x.device)
    out = torch.empty(split, tokens, rows, dtype=x.dtype if split == 1 else torch.float32, device=x.device)
    kernel[(*grid_nm, split)](x, *args, out, tokens, rows, cols, cols // split, *strides,
                              BM=config.bm, BN=config.bn, BK=bk, num_warps=config.num_warps,
                              num_stages=config.num_stages, DOT=config.dot and config.bm > 1, **constants)
    return out[0] if split == 1 else out.sum(0).to(x.dtype)


# ---- 4-bit ---------------------------------------------------------------------------------------
def _group_width(blocksize: int) -> int:
    """Columns of one scale group of the tile: a whole absmax block, at most 64 columns."""
    return min(blocksize, 64)


def fourbit_matmul(x: torch.Tensor, packed: torch.Tensor, state, config: MatmulConfig | None = None,
                   split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ dequantize_4bit(packed, state).T`` -> ``[T, N]`` in x's dtype (x contiguous)."""
    rows, cols = (int(n) for n in state.shape)
    config = config or default_config(x.shape[0])
    group = _group_width(state.blocksize)
    bk = _tile_width(cols, config.bk, group)
    if state.nested:
        nested = (state.state2.code, state.state2.absmax, state.offset)
        nb2 = int(state.state2.blocksize)
    else:
        nested, nb2 = (state.absmax, state.absmax, state.absmax), 1  # unread placeholders
    return _launch(nf4_matmul_kernel, x, rows, cols, bk, config, split,
                   (packed, state.absmax, state.code, *nested), strides=(x.stride(0),),
                   BS=int(state.blocksize), GW=group, NB2=nb2, NESTED=bool(state.nested))


def _fourbit_state_ok(state, device: torch.device) -> bool:
    if state is None or getattr(state, "quant_type", None) not in FOUR_BIT_TYPES or state.shape is None:
        return False
    if len(state.shape) != 2 or state.absmax.device != device or state.code.device != device:
        return False
    rows, cols = (int(n) for n in state.shape)
    blocksize = int(state.blocksize)
    if cols % 8 or cols % blocksize or blocksize % 32 or not _tile_width(cols, 64, _group_width(blocksize)):
        return False
    if state.code.dtype != torch.float32 or state.code.numel() != 16 or not state.absmax.is_contiguous():
        return False
    if not state.nested:
        return state.absmax.dtype == torch.float32 and state.absmax.numel() == rows * cols // blocksize
    inner = state.state2
    return (state.absmax.dtype == torch.uint8 and state.absmax.numel() == rows * cols // blocksize
            and isinstance(state.offset, torch.Tensor) and state.offset.numel() == 1
            and state.offset.dtype == torch.float32 and state.offset.device == device
            and inner.absmax.dtype == torch.float32 and inner.absmax.device == device
            and inner.code.dtype == torch.float32 and inner.code.numel() == 256 and inner.code.device == device)


def _activations_ok(x: torch.Tensor) -> bool:
    """CUDA fp16/bf16 activations of 1..SMALL_BATCH_MAX_TOKENS tokens, with the kernels switched on."""
    tokens = x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0
    return (enabled() and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)
            and 1 <= tokens <= SMALL_BATCH_MAX_TOKENS)


def bnb_4bit_matmul(x: torch.Tensor, packed: torch.Tensor, quant_state, bias: torch.Tensor | None = None):
    cols = x.shape[-1]
    out = fourbit_matmul(x.reshape(-1, cols).contiguous(), packed, quant_state)
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _fourbit_supports(x, packed, quant_state, bias=None) -> bool:
    if not (fourbit_enabled() and _activations_ok(x)):
        return False
    if not _fourbit_state_ok(quant_state, x.device) or int(quant_state.shape[1]) != x.shape[-1]:
        return False
    rows, cols = (int(n) for n in quant_state.shape)
    return (packed.device == x.device and packed.dtype == torch.uint8 and packed.is_contiguous()
            and packed.numel() * 2 == rows * cols and packed.data_ptr() % 4 == 0)


bnb_4bit_matmul.supports = _fourbit_supports


# ---- int8 ----------------------------------------------------------------------------------------
def int8_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, config: MatmulConfig | None = None,
                split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ (data * scb / 127).T`` -> ``[T, N]`` in x's dtype (weight-only int8)."""
    rows, cols = data.shape
    config = config or default_config(x.shape[0])
    bk = _tile_width(cols, config.bk, 16)
    return _launch(int8_matmul_kernel, x, rows, cols, bk, config, split, (data, scb),
                   strides=(x.stride(0), data.stride(0)))


def bnb_int8_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, threshold: float,
                    bias: torch.Tensor | None = None):
    """Weight-only: every column is computed in float from the int8 weight, which is what LLM.int8
    does for its outlier columns; ``threshold`` (which columns bitsandbytes would treat so) is moot."""
    cols = x.shape[-1]
    out = int8_matmul(x.reshape(-1, cols).contiguous(), data, scb)
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _int8_supports(x, data, scb, threshold, bias=None) -> bool:
    if not _activations_ok(x):
        return False
    return (data.device == x.device and data.dtype == torch.int8 and data.dim() == 2
            and data.shape[1] == x.shape[-1] and data.stride(1) == 1 and data.stride(0) % 4 == 0
            and data.data_ptr() % 4 == 0 and _tile_width(data.shape[1], 16, 16) > 0
            and scb.device == x.device and scb.dtype == torch.float32 and scb.shape == (data.shape[0],)
            and scb.is_contiguous())


bnb_int8_matmul.supports = _int8_supports

OPS = {"bnb_4bit_matmul": bnb_4bit_matmul, "bnb_int8_matmul": bnb_int8_matmul}
