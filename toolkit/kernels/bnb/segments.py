"""The segments of a fused 4-bit projection (q/k/v, gate/up) as one launch reads them, and the codebook
byte tables of the token-unrolled GEMV (``triton_gemv_tokens``, ``LUT=256``).

``Bnb4bitParameter.gather_statistics`` lays the segments' statistics (absmax, codebooks, nested ones)
back to back in shared buffers; ``segments_gathered`` checks that, and ``segment_launch_args`` gives the
kernels what they read besides the activations, the packed bytes and the absmax.
"""
from __future__ import annotations

import torch

MAX_SEGMENTS = 4  # fused projections the 4-bit GEMV takes in one launch (q/k/v: 3, gate/up: 2)
_BYTE_TABLES: dict = {}  # (codebooks' address, segments, device) -> (codebooks, their byte table)


def byte_table(codes: torch.Tensor) -> torch.Tensor:
    """``codes [S, 16]`` float32 -> ``[S, 256]`` int32: byte ``b``'s two values as float16, the first
    (high nibble, the earlier column) in the low half."""
    byte = torch.arange(256, device=codes.device)
    first = codes[:, byte >> 4].to(torch.float16).view(torch.int16).to(torch.int32) & 0xFFFF
    second = codes[:, byte & 15].to(torch.float16).view(torch.int16).to(torch.int32)
    return first | (second << 16)


def cached_byte_table(codes: torch.Tensor) -> torch.Tensor | None:
    """The byte table of ``codes``, built once per codebook buffer: the cache holds the buffer, so its
    address names it for good (codebooks never change after loading). None while a CUDA graph is
    being captured and it was not built before (the caller reads the codebook instead)."""
    key = (codes.data_ptr(), codes.shape[0], codes.device)
    cached = _BYTE_TABLES.get(key)
    if cached is not None:
        return cached[1]
    if codes.is_cuda and torch.cuda.is_current_stream_capturing():
        return None
    table = byte_table(codes)
    _BYTE_TABLES[key] = (codes, table)
    return table


def segment_codes(states, size: int, nested: bool) -> torch.Tensor:
    """The ``[S, size]`` codebooks of the segments (``size`` 16, or 256 for ``nested``: the nested ones),
    one buffer: the first segment's tensor and what follows it (``segments_gathered`` checked that)."""
    first = states[0].state2.code if nested else states[0].code
    return first.as_strided((len(states), size), (size, 1))


def segments_gathered(states) -> bool:
    """Whether one launch can read every segment: each statistic of segment ``i + 1`` right after
    segment ``i``'s in one buffer (``Bnb4bitParameter.gather_statistics`` lays them out so), and the
    segments alike (type, block sizes, double quantization, columns)."""
    first = states[0]
    if len(states) == 1:
        return True
    if len(states) > MAX_SEGMENTS:
        return False

    def follows(tensors) -> bool:
        return all(b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
                   and b.data_ptr() == a.data_ptr() + a.numel() * a.element_size()
                   for a, b in zip(tensors, tensors[1:]))

    alike = all(s.quant_type == first.quant_type and int(s.blocksize) == int(first.blocksize)
                and bool(s.nested) == bool(first.nested) and int(s.shape[1]) == int(first.shape[1])
                for s in states)
    if not alike or not follows([s.absmax for s in states]) or not follows([s.code for s in states]):
        return False
    if not first.nested:
        return True
    return (all(int(s.state2.blocksize) == int(first.state2.blocksize) for s in states)
            and follows([s.state2.absmax for s in states]) and follows([s.state2.code for s in states])
            and follows([s.offset.reshape(1) for s in states]))


def _segment_args(states, cols: int) -> tuple[int, ...]:
    """``R1..R3, A1..A3, B1..B3`` of ``fourbit_tokens_kernel`` (unused entries 0)."""
    firsts, absmax2, row, inner = [], [], 0, 0
    for state in states[:-1]:
        row += int(state.shape[0])
        firsts.append(row)
        if state.nested:
            inner += state.state2.absmax.numel()
        absmax2.append(inner)
    pad = [0] * (MAX_SEGMENTS - len(states))
    blocks = [first * cols // int(states[0].blocksize) for first in firsts]
    return (*firsts, *pad, *absmax2, *pad, *blocks, *pad)


def segment_launch_args(states, cols: int) -> tuple:
    """What a 4-bit kernel taking segments reads besides x, the packed bytes and the absmax: the segments'
    codebooks ``[S, 16]``, the nested statistics (code2 ``[S, 256]``, absmax2, offset; placeholders without
    double quantization), absmax2's block size, and ``R1..R3, A1..A3, B1..B3``."""
    first = states[0]
    if first.nested:
        nested = (segment_codes(states, 256, True), first.state2.absmax, first.offset)
        nb2 = int(first.state2.blocksize)
    else:
        nested, nb2 = (first.absmax, first.absmax, first.absmax), 1  # unread placeholders
    return segment_codes(states, 16, False), nested, nb2, _segment_args(states, cols)
