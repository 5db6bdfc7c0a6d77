"""Byte-level helpers for the torch GGUF dequantizers: scale fields and packed-bit unpacking.

Every dequantizer works on ``blocks``: a uint8 tensor ``[num_blocks, type_size]``, one
quantization block per row, and returns float32 ``[num_blocks, block_size]``. The helpers
here are vectorized over all blocks at once (no Python loop over blocks).
"""
from __future__ import annotations

import torch


def f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The little-endian fp16 field at byte ``offset`` of each block, as float32 ``[N, 1]``."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).float()


def unpack(packed: torch.Tensor, group: int, bits: int) -> torch.Tensor:
    """Split each byte into ``8 // bits`` fields, ggml's order: field f of byte i of a group
    of ``group`` bytes lands at ``f * group + i`` (groups follow one another).

    :param packed: uint8 ``[N, num_groups * group]``.
    :returns: uint8 ``[N, num_groups * group * 8 // bits]``, each value below ``2**bits``.
    """
    rows = packed.shape[0]
    mask = (1 << bits) - 1
    grouped = packed.reshape(rows, -1, group)
    # One contiguous shift-and-mask per field, then one stack: on CPU about twice as fast as a
    # single broadcast shift over a [rows, groups, fields, group] view (which does not vectorize).
    fields = [(grouped >> shift) & mask if shift else grouped & mask for shift in range(0, 8, bits)]
    return torch.stack(fields, dim=-2).reshape(rows, -1)


def lookup(table: tuple, index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` elementwise, as float32 (non-linear codebooks: IQ4_NL, MXFP4, ...)."""
    values = torch.tensor(table, dtype=torch.float32, device=index.device)
    return values[index.long()]


# The IQ4_NL / IQ4_XS codebook (ggml's kvalues_iq4nl): 16 non-uniform levels.
IQ4_NL_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)
# E2M1 (fp4) levels times two, the convention MXFP4/NVFP4 scales are defined against.
FP4_E2M1_X2_VALUES = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)
