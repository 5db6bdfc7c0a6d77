"""Host side of the tensor-core bitsandbytes kernels (``triton_mma``): launch shapes and K splits.

``fourbit_mma_matmul`` and ``int8_mma_matmul`` compute ``x [T, K] @ W.T`` for ``2 <= T <= 16`` tokens
(one token works too, at 1/16 of the tensor cores' use); ``triton_ops`` routes the ops' calls here.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from ..launch import launch_numbers, split_k, tile_width
from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .segments import segment_codes, segment_launch_args
from .triton_mma import fourbit_mma_kernel, int8_mma_kernel

TOKEN_TILE = 16  # tokens per program: the MMA's smallest N for 16-bit operands
MAX_CHUNK = 128  # 4-bit columns decoded per pair of dots (at most one absmax block: one scale per row)


@dataclass(frozen=True)
class MmaConfig:
    """One launch: ``bn`` weight rows per program, ``bk`` columns per K step (fewer where K or its
    split calls for it; 4-bit: whole chunks of ``min(blocksize, MAX_CHUNK)`` columns), ``split`` K (None:
    automatic: until there are ``programs_per_sm`` programs per SM, and at least ``min_split``; always a
    divisor of the K steps)."""
    bn: int = 64
    bk: int = 128
    num_warps: int = 4
    num_stages: int = 2
    split: int | None = None
    programs_per_sm: int = 1
    min_split: int = 1


# Launches from bench/bench_bnb_kernels.py --sweep-mma on an H100 (TinyLlama shapes, 8 and 16 tokens, session 10;
# docs/benchmarks.md): 64 rows fill one warpgroup's MMA (m64), 128-column steps, 3 stages of loads in flight. Each
# program is latency-bound (its dots wait for their registers), so K is split over more programs than there are
# SMs: unsplit, the small 4-bit matmuls ran at half speed (2048x2048 NF4: 14.3 us against 7.6 at split 4-8). At
# least 4 splits, as 2 were the slowest launch for the 11264-row gate/up (28-29 us against 17.6-21.3, both kinds,
# both token counts); 4-bit adds splits up to 4 programs per SM, int8 (half the decoding) none.
FOURBIT_MMA_CONFIG = MmaConfig(bn=64, bk=128, num_stages=3, programs_per_sm=4, min_split=4)
INT8_MMA_CONFIG = MmaConfig(bn=64, bk=128, num_stages=3, programs_per_sm=1, min_split=4)
# the numbers of a TOOLKIT_BNB_MMA_LAUNCH part, in order
LAUNCH_FIELDS = ("bn", "bk", "num_warps", "num_stages", "programs_per_sm", "min_split")


def launch_override(kind: str) -> MmaConfig | None:
    """``TOOLKIT_BNB_MMA_LAUNCH="4bit=BN,BK,WARPS,STAGES,PROGRAMS_PER_SM,MIN_SPLIT;int8=..."`` (either part may be left
    out): a launch that replaces the default of ``kind`` ("4bit" or "int8"), for timing alternatives in a
    whole engine without editing code. Malformed: ValueError naming the variable."""
    setting = os.environ.get("TOOLKIT_BNB_MMA_LAUNCH", "")
    for part in filter(None, (p.strip() for p in setting.split(";"))):
        name, _, values = part.partition("=")
        if name.strip() != kind:
            continue
        return MmaConfig(**launch_numbers("TOOLKIT_BNB_MMA_LAUNCH", values.strip(), LAUNCH_FIELDS))
    return None


_DECODERS: dict = {}  # (codebooks' address, segments, device, dtype) -> (codebooks, their PTX decoder or "")


def decode_asm(codes: list[float], dtype: torch.dtype) -> str:
    """PTX for ``triton_mma._nibble_codes``: 4 packed bytes in, the codebook values of their high nibbles
    (``$0, $1``: bytes 0-1, 2-3 as ``dtype`` pairs) and low nibbles (``$2, $3``) out.

    The 16 values, rounded to ``dtype``, are held as immediates: their low bytes in 4 registers, their
    high bytes in 4 more. A byte permute (``prmt``) looks up 4 indices of 0-7 in 8 bytes at once, so each
    half of a value costs two permutes (indices 0-7 and 8-15) and a ``lop3`` that takes the second where
    the index's bit 3 is set (a mask made by sign-replicating permutes). About 4 instructions per value,
    where the select tree of a 16-entry table costs 15 selects."""
    bits = [int(b) & 0xFFFF for b in torch.tensor(codes, dtype=torch.float32).to(dtype).view(torch.int16)]

    def word(values):
        return "0x%08X" % sum(v << (8 * i) for i, v in enumerate(values))

    low = [word([b & 0xFF for b in bits[i:i + 4]]) for i in range(0, 16, 4)]
    high = [word([b >> 8 for b in bits[i:i + 4]]) for i in range(0, 16, 4)]

    def values(nibbles: str, out0: str, out1: str) -> str:
        return f"""{nibbles}
and.b32 u, t, 0x07070707;
shr.u32 v, u, 4;
or.b32 v, v, u;
prmt.b32 s, v, 0, 0x4420;
shl.b32 w, t, 4;
prmt.b32 m, w, 0, 0xBA98;
prmt.b32 a, L0, L1, s;
prmt.b32 b, L2, L3, s;
lop3.b32 lo, a, b, m, 0xD8;
prmt.b32 a, H0, H1, s;
prmt.b32 b, H2, H3, s;
lop3.b32 hi, a, b, m, 0xD8;
prmt.b32 {out0}, lo, hi, 0x5140;
prmt.b32 {out1}, lo, hi, 0x7362;"""
    # t: the 4 indices as bytes; s: their low 3 bits as the permute's selector nibbles; m: 0xFF per byte
    # whose index has bit 3 set; lop3 0xD8 = (b & m) | (a & ~m); 0x5140 / 0x7362 interleave low and high bytes
    return "\n".join([
        "{",
        ".reg .b32 t, u, v, s, w, m, a, b, lo, hi, L0, L1, L2, L3, H0, H1, H2, H3;",
        *(f"mov.b32 L{i}, {value};" for i, value in enumerate(low)),
        *(f"mov.b32 H{i}, {value};" for i, value in enumerate(high)),
        values("shr.u32 t, $4, 4;\nand.b32 t, t, 0x0F0F0F0F;", "$0", "$1"),
        values("and.b32 t, $4, 0x0F0F0F0F;", "$2", "$3"),
        "}"])


def _decoder(states, dtype: torch.dtype) -> str:
    """``decode_asm`` of the segments' one codebook, built once per codebook buffer (its address names it
    for good: the cache holds it); "" (codebook loads) on a CPU, for segments whose codebooks differ, and
    while a CUDA graph is captured before it was built (reading the codebook would sync)."""
    codes = segment_codes(states, 16, False)
    if not codes.is_cuda:
        return ""
    key = (codes.data_ptr(), codes.shape[0], codes.device, dtype)
    cached = _DECODERS.get(key)
    if cached is not None:
        return cached[1]
    if torch.cuda.is_current_stream_capturing():
        return ""
    table = codes.cpu()
    asm = decode_asm(table[0].tolist(), dtype) if bool((table == table[0]).all()) else ""
    _DECODERS[key] = (codes, asm)
    return asm


def _split(config: MmaConfig, rows: int, cols: int, step: int, device: torch.device, split: int | None) -> int:
    return split or config.split or split_k(triton.cdiv(rows, config.bn), cols // step, device,
                                            config.programs_per_sm, config.min_split)


def fourbit_mma_matmul(x: torch.Tensor, packed: torch.Tensor, states, config: MmaConfig | None = None,
                       split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ W.T`` -> ``[T, N]`` in x's dtype, ``T <= 16``: ``W`` the segments of ``states`` (a
    QuantState or a list, ``segments.segments_gathered``) stacked, ``packed`` their bytes back to back.
    ``K`` must be a multiple of the block size (``triton_ops`` checks what it sends)."""
    states = [states] if not isinstance(states, (list, tuple)) else list(states)
    tokens, cols = x.shape
    rows = sum(int(state.shape[0]) for state in states)
    config = config or launch_override("4bit") or FOURBIT_MMA_CONFIG
    blocksize = int(states[0].blocksize)
    chunk = min(blocksize, MAX_CHUNK)  # one scale per row and chunk
    step = tile_width(cols, config.bk, chunk)
    split = _split(config, rows, cols, step, x.device, split)
    step = tile_width(cols // split, step, chunk)
    codes, nested, nb2, segment_args = segment_launch_args(states, cols)
    out = split_output(split, tokens, rows, x)
    fourbit_mma_kernel[(triton.cdiv(rows, config.bn), split)](
        x, packed, states[0].absmax, codes, *nested, out, tokens, rows, cols, cols // split, x.stride(0),
        *segment_args, BS=blocksize, NB2=nb2, NESTED=bool(states[0].nested), NSEG=len(states), BM=TOKEN_TILE,
        BN=config.bn, CHUNK=chunk, CHUNKS=step // chunk, DECODE=_decoder(states, x.dtype),
        num_warps=config.num_warps, num_stages=config.num_stages, **launch_options(x.device))
    return finish_splits(out, x.dtype)


def int8_mma_matmul(x: torch.Tensor, data: torch.Tensor, scb: torch.Tensor, config: MmaConfig | None = None,
                    split: int | None = None) -> torch.Tensor:
    """``x [T, K] @ (data * scb / 127).T`` -> ``[T, N]`` in x's dtype, ``T <= 16``, ``K`` a multiple of 16."""
    tokens, cols = x.shape
    rows = data.shape[0]
    config = config or launch_override("int8") or INT8_MMA_CONFIG
    step = tile_width(cols, config.bk, 16)
    split = _split(config, rows, cols, step, x.device, split)
    step = tile_width(cols // split, step, 16)
    out = split_output(split, tokens, rows, x)
    int8_mma_kernel[(triton.cdiv(rows, config.bn), split)](
        x, data, scb, out, tokens, rows, cols, cols // split, x.stride(0), data.stride(0), BM=TOKEN_TILE,
        BN=config.bn, BK=step, num_warps=config.num_warps, num_stages=config.num_stages,
        **launch_options(x.device))
    return finish_splits(out, x.dtype)
