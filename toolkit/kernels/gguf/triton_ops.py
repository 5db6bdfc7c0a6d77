"""CUDA implementations of the GGUF ops on the Triton kernels, with launch choices.

Each op has ``supports(*args)``: it declines (so the torch reference runs, and raises the typed
errors) for types without a Triton tile, float32 activations, CPU tensors or malformed data.

Launch choices (measured by ``bench/bench_gguf_kernels.py --sweep``; see the configs below):
- ``1 <= T <= TOKENS_MAX_TOKENS[type]`` (Q4_0, Q5_0, Q5_K: 8; Q8_0, Q4_K, Q6_K: 4): the token-unrolled
  int8-activation dp4a GEMV (``triton_gemv_tokens``, host side in ``dp4a_ops``, launches in ``tokens_config``;
  ``TOOLKIT_GGUF_DP4A=0`` turns the int8 kernels off); for the other types at T=1, the float32
  multiply-accumulate kernel (``BM=1``) on word-wise tiles.
- then up to ``MMQ_MAX_TOKENS[type]`` (Q4_0, Q4_K and Q6_K: 16, Q8_0: 32; Q4_K up to 32 where its
  16-bit copy would not fit in L2): the int8 tensor-core kernel
  (``triton_mmq``, launches in ``mmq_config``); up to ``FUSED_MAX_TOKENS`` for the other types the
  fused ``tl.dot`` kernel with ``BM=16``.
- Q4_0, Q8_0, Q4_K and Q6_K at 17-64 tokens, ahead of the int8 kernels: the 16-bit tensor-core kernel
  (``triton_dot16``, ``dot16_ops``; ``TOOLKIT_GGUF_DOT16=0`` turns it off).
- larger ``T`` (prefill): Triton dequantize to x's dtype, then the dense matmul (cuBLAS): 3-4x
  faster than the fused kernel at BM=128, which re-unpacks W once per token tile.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from .bits import IQ4_NL_VALUES
from .dot16_ops import dot16_hands_on, dot16_matmul, dot16_takes
from .dp4a_ops import (_HARDWARE_DP4A, _dp4a_ok, activation_blocks, dp4a_enabled,  # noqa: F401 - callers import
                       dp4a_tokens_matmul, quantize_activations)                  # them from here too
from .gemv_launch import (DP4A_STEP, MMQ_EVICTION, MMQ_MIN_TYPES, MMQ_TYPES, TOKENS_MAX_TOKENS,  # noqa: F401 -
                          TOKENS_SUM_TYPES, GemvConfig, eviction)          # DP4A_STEP, GemvConfig: callers' names
from .types import block_size, type_name, type_size
from ..int8_blocks import Int8Input
from ..launch import l2_bytes, num_sms, split_k
from ..launch import tile_width as _tile_width  # the MoE kernels import it from here
from ..triton_pdl import launch_options
from ..split_sums import SplitSums
from ..triton_reduce import finish_splits, split_output

# Scale sub-block per type: the tile width must be a multiple of it.
SUB_BLOCK = {"Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "Q8_0": 32, "IQ4_NL": 32,
             "Q2_K": 16, "Q3_K": 16, "Q4_K": 32, "Q5_K": 32, "Q6_K": 16, "IQ4_XS": 32}
TRITON_TYPES = frozenset(SUB_BLOCK)
# Types with a word-wise matmul tile (triton_words), and the columns one of its groups spans;
# the others use the element-wise tile inside the matmul.
WORD_GROUP = {"Q8_0": 32, "Q4_0": 32, "Q4_1": 32, "Q5_0": 32, "Q5_1": 32, "IQ4_NL": 32,
              "Q4_K": 64, "Q5_K": 64, "Q6_K": 128}
FUSED_MAX_TOKENS = 16


@dataclass(frozen=True)
class MatmulConfig:
    """One launch shape: ``BM`` tokens x ``BN`` rows per program, ``BK`` columns per step."""
    bm: int
    bn: int
    bk: int
    num_warps: int = 4
    num_stages: int = 2


# Chosen from bench/bench_gguf_kernels.py --sweep (CUDA-graph timing, weights beyond L2) on an
# H100, for Q4_K, Q8_0, Q6_K, Q5_0 at 4096x4096, 14336x4096 and 4096x14336:
# - decode: BK=512 beat the earlier BK=256 in 11 of 12 cases (wider K steps keep more bytes in
#   flight per program, which a memory-bound GEMV needs); splitting K in two was slower in all 12;
#   Q6_K's heavier unpacking gains from 8 warps in all three shapes;
# - small batches (T=8): BN=64, BK=128 was faster than or equal to the earlier BK=64 in 12 of 12.
DECODE_CONFIG = MatmulConfig(bm=1, bn=8, bk=512)
DECODE_CONFIG_BY_TYPE = {"Q6_K": MatmulConfig(bm=1, bn=8, bk=512, num_warps=8)}
SMALL_BATCH_CONFIG = MatmulConfig(bm=16, bn=64, bk=128)


@dataclass(frozen=True)
class MmqConfig:
    """An int8 tensor-core launch: ``BN`` rows per program, warps, pipeline stages, and how many programs
    per SM the K split aims at (the split is the power of two, at most 8, nearest that target)."""
    bn: int
    num_warps: int
    num_stages: int
    programs_per_sm: int


# Tokens and types for which gguf_matmul takes the int8 tensor-core kernel (triton_mmq), and its launch.
# From bench/bench_gguf_kernels.py --sweep --variants mmq (CUDA-graph timing, H100, T = 2/8/16/32/64,
# 14336x4096 and 4096x14336; session-4 sweep in docs/benchmarks.md):
# - the earlier one-program-per-row-tile launch (BN=64, 4 warps, no split: 224 or 64 programs) left SMs
#   waiting on memory; ~8 programs per SM (BN=32, 2 warps, 3 stages, K split 2 at 14336 rows, 8 at 4096)
#   took Q4_K at T=2-16 from 60-98 us to 56-80 us and Q8_0 from 69-111 us (the float kernel) to 51-61 us;
#   Q6_K prefers 4 warps and more programs (65-79 against 74-109 us);
# - at T=32 (BM=32) the same holds for Q8_0 (82-84 us against dequantize + cuBLAS's 122); Q4_K and Q6_K
#   at BN=64, 4 warps, ~2 programs per SM were only 99-104 us against 112-117 at these shapes, and in the
#   engine (side by side with llama.cpp, H100) batch 32 of the 1.5B Q4_K_M file fell from 7,382 to 5,729
#   tok/s with them (8B: 2,063 -> 2,121), so Q4_K and Q6_K stop at 16 tokens; at T=64 dequantize +
#   cuBLAS wins for every type;
# - Q4_0 first read its activations in a permuted order inside the kernel and won only at T=2; with the
#   activations permuted once per call (``mmq_matmul``) it took 52-58 us against the float kernel's
#   75-106 at 14336x4096 and 4096x14336, 26-36 against 33-41 at the 1.5B model's shapes (T = 2-16), and
#   the 1.5B Q4_0 file's batch-8 decode went from 2,459 to 2,772 tok/s (medians of 3 alternations).
# - session 6: the kernel unpacks four weights per 32-bit register (``triton_mmq.nibbles``, ``six_bits``) and
#   reads the scales as words; Q4_K's PTX per super-block fell from 3,314 to 2,105 instructions (BM=32, BN=32,
#   2 warps). ``.dev`` sweep on an H100 (same run, CUDA-graph timing), us at 14336x4096 / 4096x14336, old
#   kernel -> new (launch above): Q4_K T=8 50.5/50.2 -> 39.1/38.4, T=16 67.7/65.0 -> 46.6/48.8, T=32 103.5/95.0
#   -> 76.6/81.0 (BM=32) against dequantize + cuBLAS's 113.8/112.6; at T=64 it lost at 14336x4096 (best 153.6
#   against 112.0). At the 1.5B model's shapes, T=32, dequantize + cuBLAS stayed ahead where the bf16 copy fits
#   in L2 (3072x2048: 14.0 against 28.1; 2048x8192: 29.9 against 34.1) and lost where it does not (16384x2048:
#   66.1 against 56.7). So Q4_K takes it at 17-32 tokens only for weights whose 16-bit copy exceeds L2
#   (``MMQ_LARGE_MAX_TOKENS``). Q6_K: T=8/16 within 5% of the old kernel, T=32 130-137 against dequantize +
#   cuBLAS's 116 at 14336x4096, so it stays at 16.
# - session 13: the kernel loads each super-block's scale words and token scales at the top of its iteration
#   (``triton_mmq._k_head``, ``_token_scales``). Q6_K's own launch (4 warps, ~16 programs per SM) then lost to the
#   common one at every shape: us at 14336x4096 / 4096x14336 / 2048x8192 / 16384x2048, T=8, 67.5 / 65.8 / 22.6 /
#   42.0 against 65.5 / 61.6 / 20.1 / 36.4 (``--sweep``, one call), so it has none.
MMQ_MIN_TOKENS = 2
MMQ_MAX_TOKENS = {"Q4_0": 16, "Q4_K": 16, "Q6_K": 16, "Q8_0": 32}     # the types gguf_matmul sends to it, up to T
MMQ_LARGE_MAX_TOKENS = {"Q4_K": 32}   # ... and up to T when the weight's 16-bit copy would not fit in L2
MMQ_CONFIG = MmqConfig(bn=32, num_warps=2, num_stages=3, programs_per_sm=8)
MMQ_CONFIG_BY_TYPE: dict[str, MmqConfig] = {}
# Types whose tiles put the weight rows on the MMA's M side and the tokens on its N side (``triton_mmq._idot``):
# 8 tokens then fill an 8-wide tile instead of half of a 16-high one, and the compiled Q4_K loop has 512
# instructions per super-block against 805. Alone on one weight the kernel timed the same (session 13, H100, T=8,
# us at 14336x4096 / 4096x14336 / 2048x8192 / 16384x2048: 38.9 / 39.4 / 23.3 / 23.7 against 39.5 / 36.4 / 22.9 /
# 23.4), but in the engine batch 8 went from 1,271-1,273 to 1,372-1,373 tok/s (8B Q4_K_M) and 3,813-3,961 to
# 4,100-4,101 (1.5B Q4_K_M), fresh processes alternating in one call. Q6_K's 2-aligned blocks go through shared
# memory in that orientation (30 barriers per super-block; 104.7 us at 14336x4096, T=8), so it keeps the tokens
# first, as do Q4_0 and Q8_0 (not measured rows-first).
MMQ_ROWS_FIRST = frozenset({"Q4_K", "Q5_K"})


def mmq_config(name: str) -> MmqConfig:
    """The measured launch of type ``name`` (the same for every dispatched token count)."""
    return MMQ_CONFIG_BY_TYPE.get(name, MMQ_CONFIG)


def _type_args(qtype: int) -> dict:
    name = type_name(qtype)
    return {"QTYPE": int(qtype), "TS": type_size(qtype), "BLOCK": block_size(qtype), "SUB": SUB_BLOCK[name]}


@functools.lru_cache(maxsize=None)
def _codebook(device: torch.device) -> torch.Tensor:
    return torch.tensor(IQ4_NL_VALUES, dtype=torch.float32, device=device)


def _packed_ok(data: torch.Tensor, qtype: int, cols: int) -> bool:
    if not (data.is_cuda and data.dtype == torch.uint8 and data.dim() == 2 and data.stride(1) == 1):
        return False
    if data.data_ptr() % 4 or data.stride(0) % 2:  # the kernels read 16/32-bit words
        return False
    if type_name(qtype) not in TRITON_TYPES or cols % block_size(qtype):
        return False
    return data.shape[1] == cols // block_size(qtype) * type_size(qtype)


def gguf_dequantize(data: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    rows = data.shape[0]
    out = torch.empty(rows, cols, dtype=dtype, device=data.device)
    bk = _tile_width(cols, 256)
    bn = max(1, min(32, 8192 // bk))
    grid = (triton.cdiv(rows, bn), cols // bk)
    from .triton_kernels import dequantize_kernel  # noqa: PLC0415 - at first use: gemv_launch says why
    dequantize_kernel[grid](data, out, _codebook(data.device), rows, cols, data.stride(0),
                            BN=bn, BK=bk, **_type_args(qtype))
    return out


gguf_dequantize.supports = lambda data, qtype, cols, dtype: (
    _packed_ok(data, qtype, cols) and dtype in (torch.float16, torch.bfloat16, torch.float32))


def _matmul_tile_width(qtype: int, cols: int, wanted: int) -> int:
    """A tile width for the matmul: at least one word-layout group of the type."""
    group = WORD_GROUP.get(type_name(qtype), 32)
    return _tile_width(cols, max(wanted, group))


def fused_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, config: MatmulConfig,
                 split: int | None = None, words: bool = True) -> torch.Tensor:
    """``x [T, cols] @ W.T`` with the fused kernel under ``config`` (``split=None``: automatic;
    ``words=False``: element-wise tiles even where a word-wise one exists)."""
    tokens, rows = x.shape[0], data.shape[0]
    # Large-BM tiles are prefill-sized, where dequantize + cuBLAS wins anyway; Triton 3.6 also
    # fails to compile tl.dot on the permuted word-tile operands at BM=128 (32 and 64: measured by
    # bench/bench_gguf_kernels.py's "batch" sweep, not dispatched by gguf_matmul).
    words = words and config.bm <= 64 and type_name(qtype) in WORD_GROUP
    # element-wise tiles stay inside one super-block (<= 256 columns)
    bk = _matmul_tile_width(qtype, cols, config.bk) if words else _tile_width(cols, min(config.bk, 256))
    grid_nm = (triton.cdiv(rows, config.bn), triton.cdiv(tokens, config.bm))
    if split is None:
        split = split_k(grid_nm[0] * grid_nm[1], cols // bk, x.device)
    out = split_output(split, tokens, rows, x)
    from .triton_kernels import matmul_kernel  # noqa: PLC0415
    matmul_kernel[(*grid_nm, split)](
        x, data, out, _codebook(x.device), tokens, rows, cols // split, data.stride(0), x.stride(0),
        BM=config.bm, BN=config.bn, BK=bk, num_warps=config.num_warps, num_stages=config.num_stages,
        WORDS=words, **_type_args(qtype))
    return finish_splits(out, x.dtype)


def mmq_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, bm: int | None = None,
               bn: int | None = None, num_warps: int | None = None, split: int | None = None,
               num_stages: int | None = None, unreduced: bool = False) -> torch.Tensor:
    """``x [T, cols] @ W.T`` on int8 tensor cores (``triton_mmq``): 8-bit activations in blocks of 32;
    ``[T, rows]`` in x's dtype. ``bm``: tokens per program (default: T rounded up, 16 to 64; from 8 for the
    ``MMQ_ROWS_FIRST`` types); ``bn``, ``num_warps``, ``num_stages`` and ``split`` (K splits) default to
    ``mmq_config``'s launch. ``unreduced``: split-K partial sums returned as they are (``finish_splits``)."""
    tokens, rows = x.shape[0], data.shape[0]
    name = type_name(qtype)
    config = mmq_config(name)
    bn, num_warps = bn or config.bn, num_warps or config.num_warps
    num_stages = num_stages or config.num_stages
    quants, scales, sums = mmq_activations(x, name)
    rows_first = name in MMQ_ROWS_FIRST
    bm = bm or max(8 if rows_first else 16, min(64, triton.next_power_of_2(tokens)))
    grid_nm = (triton.cdiv(rows, bn), triton.cdiv(tokens, bm))
    block = MMQ_TYPES[name]
    if split is None:
        split = _mmq_split(grid_nm[0] * grid_nm[1], config.programs_per_sm, x.device)
    while (cols // block) % split:  # each split: whole blocks
        split -= 1
    out = split_output(split, tokens, rows, x)
    from .triton_mmq import mmq_kernel  # noqa: PLC0415
    mmq_kernel[(*grid_nm, split)](
        quants, scales, sums, data, out, tokens, rows, cols, cols // split, data.stride(0), out.stride(1),
        out.stride(0), QTYPE=int(qtype), TS=type_size(qtype), BM=bm, BN=bn, EVICT=eviction(MMQ_EVICTION, name),
        ROWS_FIRST=rows_first, num_warps=num_warps, num_stages=num_stages, **launch_options(x.device))
    return finish_splits(out, x.dtype, unreduced)


def mmq_activations(x: torch.Tensor, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x [T, cols]`` as the mmq kernels read it: int8 quants ``[T, cols]`` (for Q4_0 each block in the
    kernel's weight order: position 2i + h is column i + 16h), float32 scales ``[T, cols / 32]`` and
    block sums ``d * sum(q)`` (the scales again where the type has no minimum term: never read)."""
    tokens, cols = x.shape
    blocks = activation_blocks(x, sums=name in MMQ_MIN_TYPES)
    words, scales, sums = blocks.words, blocks.scales, blocks.sums if name in MMQ_MIN_TYPES else None
    quants = words.view(torch.int8)                                          # [T, cols], natural order
    if name == "Q4_0":
        quants = quants.view(tokens, cols // 32, 2, 16).transpose(2, 3).contiguous().view(tokens, cols)
    return quants, scales, scales if sums is None else sums


def _mmq_split(tiles: int, programs_per_sm: int, device: torch.device) -> int:
    """The power of two (1 to 8) nearest ``programs_per_sm * SMs / tiles``: enough programs in flight to
    keep the memory system busy, without a partial-sum buffer larger than it needs."""
    want = programs_per_sm * num_sms(device) / max(tiles, 1)
    return 1 if want <= 1 else min(8, 2 ** round(math.log2(want)))


def _mmq_max_tokens(data: torch.Tensor, name: str, cols: int) -> int:
    """The most tokens the int8 tensor-core kernel takes for this weight: beyond ``MMQ_MAX_TOKENS`` a dequantized
    copy that fits in L2 makes dequantize + cuBLAS the faster path (measured above)."""
    if name in MMQ_LARGE_MAX_TOKENS and data.shape[0] * cols * 2 > l2_bytes(data.device):
        return MMQ_LARGE_MAX_TOKENS[name]
    return MMQ_MAX_TOKENS.get(name, 0)


def _mmq_ok(data: torch.Tensor, qtype: int, cols: int, tokens: int) -> bool:
    name = type_name(qtype)
    # Q4_K/Q5_K scales are read as 32-bit words: rows must stay 4-aligned
    return (name in MMQ_MAX_TOKENS and MMQ_MIN_TOKENS <= tokens <= _mmq_max_tokens(data, name, cols)
            and cols % MMQ_TYPES[name] == 0 and dp4a_enabled()
            and (name not in ("Q4_K", "Q5_K") or data.stride(0) % 4 == 0))


def _int8_kernel(data: torch.Tensor, qtype: int, cols: int, tokens: int):
    """The int8-activation kernel ``gguf_matmul`` takes for this call (dp4a or mmq), or None (also where the
    16-bit kernel takes it first: then no one asks the norm for int8 blocks it would not read)."""
    if dot16_takes(data, qtype, cols, tokens):
        return None
    if tokens <= TOKENS_MAX_TOKENS.get(type_name(qtype), 0) and _dp4a_ok(data, qtype, cols):
        return dp4a_tokens_matmul
    if _mmq_ok(data, qtype, cols, tokens):
        return mmq_matmul
    return None


def int8_activations(qtype: int, cols: int, tokens: int, data: torch.Tensor) -> bool:
    """Whether ``gguf_matmul`` rounds these activations to int8 blocks (the dp4a or the mmq kernel)."""
    return _int8_kernel(data, qtype, cols, tokens) is not None


def gguf_int8_input(data: torch.Tensor, qtype: int, cols: int, tokens: int) -> Int8Input | None:
    """What ``gguf_matmul`` reads for ``tokens`` activation rows: int8 blocks (with their sums for the types
    whose kernel has a minimum term) where an int8 kernel serves, else None (float activations)."""
    kernel = _int8_kernel(data, qtype, cols, tokens)
    if kernel is None:
        return None
    sum_types = TOKENS_SUM_TYPES if kernel is dp4a_tokens_matmul else MMQ_MIN_TYPES
    return Int8Input(sums=type_name(qtype) in sum_types)


gguf_int8_input.supports = lambda data, qtype, cols, tokens: _packed_ok(data, qtype, cols)


def gguf_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int,
                unreduced: bool = False) -> torch.Tensor | SplitSums:
    """``x @ W.T``; ``unreduced`` (x 2-D): where the kernel splits K, its partial sums as ``SplitSums``."""
    # x itself when it is already [T, cols] and contiguous, so that blocks attached to it are found
    flat = x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, cols).contiguous()
    tokens = flat.shape[0]
    if dot16_takes(data, qtype, cols, tokens):
        out = dot16_matmul(flat, data, qtype, cols, unreduced=unreduced and dot16_hands_on(qtype))
    elif (int8_kernel := _int8_kernel(data, qtype, cols, tokens)) is not None:
        out = int8_kernel(flat, data, qtype, cols, unreduced=unreduced)
    elif tokens == 1:
        out = fused_matmul(flat, data, qtype, cols, DECODE_CONFIG_BY_TYPE.get(type_name(qtype), DECODE_CONFIG))
    elif tokens <= FUSED_MAX_TOKENS:
        out = fused_matmul(flat, data, qtype, cols, SMALL_BATCH_CONFIG)
    else:
        out = flat @ gguf_dequantize(data, qtype, cols, x.dtype).T
    return out if isinstance(out, SplitSums) else out.reshape(*x.shape[:-1], data.shape[0])


gguf_matmul.supports = lambda x, data, qtype, cols: (
    _packed_ok(data, qtype, cols) and x.is_cuda and x.dtype in (torch.float16, torch.bfloat16)
    and x.shape[-1] == cols)


def gguf_matmul_unreduced(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor | SplitSums:
    """``gguf_matmul`` of a 2-D x for a caller whose next op adds split-K partial sums (``kernels/split_sums``)."""
    return gguf_matmul(x, data, qtype, cols, unreduced=True)


gguf_matmul_unreduced.supports = lambda x, data, qtype, cols: gguf_matmul.supports(x, data, qtype, cols) and x.dim() == 2


def gguf_embedding(ids: torch.Tensor, data: torch.Tensor, qtype: int, cols: int,
                   dtype: torch.dtype) -> torch.Tensor:
    rows = data.index_select(0, ids.reshape(-1).long())
    return gguf_dequantize(rows, qtype, cols, dtype).reshape(*ids.shape, cols)


gguf_embedding.supports = lambda ids, data, qtype, cols, dtype: (
    gguf_dequantize.supports(data, qtype, cols, dtype) and ids.is_cuda)

OPS = {"gguf_dequantize": gguf_dequantize, "gguf_matmul": gguf_matmul, "gguf_embedding": gguf_embedding,
       "gguf_int8_input": gguf_int8_input, "gguf_matmul_unreduced": gguf_matmul_unreduced}
