"""CUDA implementations of ``bnb_4bit_matmul`` and ``bnb_int8_matmul`` on the Triton kernels, for
1..``SMALL_BATCH_MAX_TOKENS`` tokens (decode); larger calls and anything the kernels do not handle
are declined by ``supports`` and run bitsandbytes' own path (the op's reference).

What is declined: float32 activations (the schemes compute in the model's fp16/bf16), CPU tensors,
4-bit blocks that straddle rows (``K % blocksize``) or rows not a whole number of 32-bit words,
non-contiguous or misaligned packed data, int8 rows not 4-byte aligned.

Which kernel takes a call:
- 4-bit (``fourbit_kernel``): one token, the token-unrolled GEMV (``triton_gemv_tokens``: each program reads
  its rows once for all tokens, one accumulator per token); 2..16 tokens, the tensor-core kernel
  (``triton_mma`` via ``mma_ops``), measured at 0.96-1.00x dense bf16's time per token at batch 8 against
  bitsandbytes' 2.5-3.1x (docs/benchmarks.md).
- int8: one token, the first weight-only kernel (``triton_kernels``, ``MatmulConfig``: many small programs
  of 8 rows with 512-column K steps); 2..16 tokens, the tensor-core kernel.
``TOOLKIT_BNB_MMA=0`` takes the tensor-core kernels out (2..16 tokens of 4-bit go to bitsandbytes, of int8 to
the first kernel). The first kernels' ``tl.dot`` tiles and the token GEMVs' tables (``FOURBIT_TOKENS_CONFIG``,
``INT8_TOKENS_CONFIG``) stay for ``bench/bench_bnb_kernels.py``'s comparisons and their tests.
``bnb_4bit_matmul_segments`` runs a fused projection's segments (q/k/v, gate/up) in one launch when their
statistics lie back to back (``Bnb4bitParameter.gather_statistics``; ``segments``).

``TOOLKIT_BNB_TRITON=0`` makes both decline (bitsandbytes runs everything; call
``runtime.invalidate()`` after changing it in a running process, as the runtime caches choices).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from ..launch import split_k, tile_width as _tile_width
from ..triton_reduce import finish_splits, split_output
from . import SMALL_BATCH_MAX_TOKENS
from .mma_ops import fourbit_mma_matmul, int8_mma_matmul
from .segments import cached_byte_table, segment_launch_args, segments_gathered
from .triton_gemv_tokens import fourbit_tokens_kernel, int8_tokens_kernel
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


@dataclass(frozen=True)
class TokensConfig:
    """A token-unrolled GEMV launch: ``bn`` rows per program, ``bk`` columns per step, ``split`` K
    (None: automatic, while there are fewer programs than SMs); ``lut`` (4-bit): 16 for float32
    codebook lookups per value, 256 for a byte table of float16 pairs (``triton_gemv_tokens``)."""
    bn: int
    bk: int
    num_warps: int = 4
    split: int | None = None
    lut: int = 16
    num_stages: int = 2


# Launches by tokens, ((up to T, config), ...), the first holding T wins; T beyond the last entry is
# left to the first kernels (``default_config``). Not measured yet: chosen from the compiled sm_90
# code (ptxas via triton.compile on a CPU): no layout conversion or shared memory in the K loop, one
# FMA per weight and token, threads along a row's words with every thread holding all BN rows (one
# activation load serves BN rows). 4 rows x 1024 columns x 4 warps give each thread one word of 4 rows
# per step: 32 registers at T=1, 128 at T=8; at T=16 that reaches 254 (2 programs per SM), so 9-16
# tokens take 2 rows (72 registers). int8 words hold 4 values: 512 columns give each thread one word
# per row; 2 rows above 4 tokens for the same reason. ``bench/bench_bnb_kernels.py --sweep`` times the
# alternatives (``TOKENS_SWEEP`` there) against bitsandbytes, the first kernels and dense bf16.
TOKENS_FEW = TokensConfig(bn=4, bk=1024)
TOKENS_MANY = TokensConfig(bn=2, bk=1024)
FOURBIT_TOKENS_CONFIG: tuple[tuple[int, TokensConfig], ...] = ((8, TOKENS_FEW), (16, TOKENS_MANY))
# int8: the token-unrolled GEMV lost to the first kernels at 8 tokens on an H100 (bench/bench_bnb_kernels.py
# --tokens 1,8, TinyLlama shapes, session 6, us new / first: q/k/v 15.7 / 17.1, 2048x2048 13.6 / 12.7,
# gate/up 53.7 / 27.3, down 28.9 / 21.9) and the engine's batch-8 TPOT rose from 1.39-1.53x dense to
# 1.67-1.77x with it, so it takes no call by default (INT8_TOKENS_MIN above SMALL_BATCH_MAX_TOKENS); lower
# it to try the kernel (its tests call it directly).
INT8_TOKENS_MIN = SMALL_BATCH_MAX_TOKENS + 1
INT8_TOKENS_CONFIG: tuple[tuple[int, TokensConfig], ...] = ((4, TokensConfig(bn=4, bk=512)),
                                                            (16, TokensConfig(bn=2, bk=512)))


def tokens_config(table, tokens: int) -> TokensConfig | None:
    """The table's launch for ``tokens``, or None where the first kernels take it."""
    return next((config for most, config in table if tokens <= most), None)


def enabled() -> bool:
    return os.environ.get("TOOLKIT_BNB_TRITON", "1") != "0"


# The 4-bit kernels' default (``TOOLKIT_BNB_TRITON_4BIT`` unset): the token-unrolled GEMV for one-token calls
# only. On an H100 (bench/bench_bnb_kernels.py --tokens 1,8, TinyLlama shapes, CUDA graphs, session 6), us
# new / bitsandbytes: T=1 q/k/v in one launch 6.3 / 15.0, 2048x2048 5.9 / 6.4, gate/up 20.1 / 19.3, down
# 17.1 / 12.4 (49.4 / 53.1 in all), and the engine's NF4 batch-1 TPOT was 0.97x dense bf16 (1.62 / 1.67 ms;
# bitsandbytes' path measured 1.21x in session 4). At T=8 it lost where K is long (down: 96.4 / 22.8; all four:
# 182 / 166), so 2-16 tokens go to the tensor-core kernel (``mma_ops``), or with ``TOOLKIT_BNB_MMA=0`` to
# bitsandbytes.
FOURBIT_DEFAULT_MAX_TOKENS = 1


def mma_enabled() -> bool:
    """Whether 2..16-token calls may run the tensor-core kernels (``TOOLKIT_BNB_MMA=0``: no)."""
    return os.environ.get("TOOLKIT_BNB_MMA", "1") != "0"


def fourbit_kernel(tokens: int) -> str | None:
    """Which kernel takes a 4-bit call of ``tokens`` (1..SMALL_BATCH_MAX_TOKENS): ``"tokens"`` (the token-unrolled
    GEMV: one-token calls, or every small batch with ``TOOLKIT_BNB_TRITON_4BIT=1``), ``"mma"`` (the tensor-core
    kernel: 2..16 tokens), or None (bitsandbytes: ``TOOLKIT_BNB_TRITON_4BIT=0``, or ``TOOLKIT_BNB_MMA=0``)."""
    setting = os.environ.get("TOOLKIT_BNB_TRITON_4BIT", "")
    if setting == "0":
        return None
    if tokens <= FOURBIT_DEFAULT_MAX_TOKENS or setting == "1":
        return "tokens"
    return "mma" if mma_enabled() else None


def default_config(tokens: int) -> MatmulConfig:
    return DECODE_CONFIG if tokens == 1 else SMALL_BATCH_CONFIG


def _launch(kernel, x: torch.Tensor, rows: int, cols: int, bk: int, config: MatmulConfig, split: int | None,
            args: tuple, strides: tuple, **constants) -> torch.Tensor:
    """Run ``kernel`` over (row tiles, token tiles, K splits); ``[T, rows]`` in x's dtype."""
    tokens = x.shape[0]
    grid_nm = (triton.cdiv(rows, config.bn), triton.cdiv(tokens, config.bm))
    if split is None:
        split = split_k(grid_nm[0] * grid_nm[1], cols // bk, x.device)
    out = split_output(split, tokens, rows, x)
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
    """``x @ W.T (+ bias)`` with the kernel ``fourbit_kernel`` names for the call's tokens: the token-unrolled
    GEMV (``fourbit_tokens_matmul``) or the tensor-core kernel (``mma_ops.fourbit_mma_matmul``);
    ``quant_state``: one QuantState, or a fused projection's gathered segments (``bnb_4bit_matmul_segments``)."""
    cols = x.shape[-1]
    flat = x.reshape(-1, cols).contiguous()
    if fourbit_kernel(flat.shape[0]) == "mma":
        out = fourbit_mma_matmul(flat, packed, quant_state)
    else:
        out = fourbit_tokens_matmul(flat, packed, quant_state)
    out = out.reshape(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def _fourbit_supports(x, packed, quant_state, bias=None) -> bool:
    if not (_activations_ok(x) and fourbit_kernel(x.numel() // x.shape[-1])):
        return False
    if not _fourbit_state_ok(quant_state, x.device) or int(quant_state.shape[1]) != x.shape[-1]:
        return False
    rows, cols = (int(n) for n in quant_state.shape)
    return (packed.device == x.device and packed.dtype == torch.uint8 and packed.is_contiguous()
            and packed.numel() * 2 == rows * cols and packed.data_ptr() % 4 == 0)


bnb_4bit_matmul.supports = _fourbit_supports


# ---- 4-bit, token-unrolled (triton_gemv_tokens) -----------------------------------------------------
def fourbit_tokens_matmul(x: torch.Tensor, packed: torch.Tensor, states, config: TokensConfig | None = None,
                          split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ W.T`` -> ``[T, N]`` in x's dtype for ``T <= 16`` with the token-unrolled 4-bit GEMV:
    ``W`` is the segments of ``states`` (a QuantState or a list of them, ``segments_gathered``) stacked,
    ``packed`` their bytes back to back (x contiguous)."""
    states = [states] if not isinstance(states, (list, tuple)) else list(states)
    tokens, cols = x.shape
    rows = sum(int(state.shape[0]) for state in states)
    config = config or tokens_config(FOURBIT_TOKENS_CONFIG, tokens) or TOKENS_MANY
    first = states[0]
    codes, nested, nb2, segment_args = segment_launch_args(states, cols)
    lut = config.lut
    table = cached_byte_table(codes) if lut == 256 else None
    if table is None:
        lut = 16
    grid_n = triton.cdiv(rows, config.bn)
    bk = _tile_width(cols, config.bk, 8)
    split = split or config.split or split_k(grid_n, cols // bk, x.device)
    bk = _tile_width(cols // split, bk, 8)
    out = split_output(split, tokens, rows, x)
    fourbit_tokens_kernel[(grid_n, split)](
        x, packed, first.absmax, codes if table is None else table, *nested, out, tokens, rows, cols,
        cols // split, x.stride(0), *segment_args, BS=int(first.blocksize), NB2=nb2,
        NESTED=bool(first.nested), NSEG=len(states), LUT=lut, BM=triton.next_power_of_2(tokens), BN=config.bn,
        BK=bk, num_warps=config.num_warps, num_stages=config.num_stages)
    return finish_splits(out, x.dtype)


def bnb_4bit_matmul_segments(x: torch.Tensor, packed: torch.Tensor, quant_states, bias: torch.Tensor | None = None):
    """``x @ W.T (+ bias)`` for a fused projection in one launch: ``W`` the segments of ``quant_states``
    stacked, ``packed`` their bytes back to back (an op of its own: its ``supports`` differs)."""
    return bnb_4bit_matmul(x, packed, quant_states, bias)


def _segments_supports(x, packed, quant_states, bias=None) -> bool:
    if not _activations_ok(x) or not isinstance(quant_states, (list, tuple)):
        return False
    tokens = x.numel() // x.shape[-1]
    if not fourbit_kernel(tokens) or not quant_states:
        return False
    if not all(_fourbit_state_ok(state, x.device) for state in quant_states):
        return False
    rows = sum(int(state.shape[0]) for state in quant_states)
    return (int(quant_states[0].shape[1]) == x.shape[-1] and segments_gathered(quant_states)
            and packed.device == x.device and packed.dtype == torch.uint8 and packed.is_contiguous()
            and packed.numel() * 2 == rows * x.shape[-1] and packed.data_ptr() % 4 == 0)


bnb_4bit_matmul_segments.supports = _segments_supports


# ---- int8 ----------------------------------------------------------------------------------------
def int8_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, config: MatmulConfig | None = None,
                split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ (data * scb / 127).T`` -> ``[T, N]`` in x's dtype (weight-only int8)."""
    rows, cols = data.shape
    config = config or default_config(x.shape[0])
    bk = _tile_width(cols, config.bk, 16)
    return _launch(int8_matmul_kernel, x, rows, cols, bk, config, split, (data, scb),
                   strides=(x.stride(0), data.stride(0)))


def int8_tokens_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, config: TokensConfig | None = None,
                       split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ (data * scb / 127).T`` for ``T <= 16`` with the token-unrolled int8 GEMV."""
    tokens, cols = x.shape
    rows = data.shape[0]
    config = config or tokens_config(INT8_TOKENS_CONFIG, tokens) or INT8_TOKENS_CONFIG[-1][1]
    grid_n = triton.cdiv(rows, config.bn)
    bk = _tile_width(cols, config.bk, 4)
    split = split or config.split or split_k(grid_n, cols // bk, x.device)
    bk = _tile_width(cols // split, bk, 4)
    out = split_output(split, tokens, rows, x)
    int8_tokens_kernel[(grid_n, split)](x, data, scb, out, tokens, rows, cols, cols // split, x.stride(0),
                                        data.stride(0), BM=triton.next_power_of_2(tokens), BN=config.bn, BK=bk,
                                        num_warps=config.num_warps, num_stages=config.num_stages)
    return finish_splits(out, x.dtype)


def bnb_int8_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, threshold: float,
                    bias: torch.Tensor | None = None):
    """Weight-only: every column is computed in float from the int8 weight, which is what LLM.int8
    does for its outlier columns; ``threshold`` (which columns bitsandbytes would treat so) is moot. One
    token runs the first int8 kernel, 2..16 the tensor-core one (``mma_ops``; ``TOOLKIT_BNB_MMA=0``: the first)."""
    cols = x.shape[-1]
    flat = x.reshape(-1, cols).contiguous()
    tokens = flat.shape[0]
    config = tokens_config(INT8_TOKENS_CONFIG, tokens) if tokens >= INT8_TOKENS_MIN else None
    if config is not None:
        out = int8_tokens_matmul(flat, data, scb, config)
    elif tokens > 1 and mma_enabled():
        out = int8_mma_matmul(flat, data, scb)
    else:
        out = int8_matmul(flat, data, scb)
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

OPS = {"bnb_4bit_matmul": bnb_4bit_matmul, "bnb_4bit_matmul_segments": bnb_4bit_matmul_segments,
       "bnb_int8_matmul": bnb_int8_matmul}
