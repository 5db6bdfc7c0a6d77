"""GGUF quantization types: sizes, names and input checks shared by every GGUF op.

Sizes come from gguf-py's ``GGML_QUANT_SIZES`` (the format's own table), so there is one
source of truth for how many bytes a block of each type takes.
"""
from __future__ import annotations

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ...core.errors import ShapeMismatchError, UnsupportedQuantTypeError


def type_name(qtype: int) -> str:
    """``"Q4_K"`` for 12; ``"type 99"`` for a number GGUF does not define."""
    try:
        return GGMLQuantizationType(int(qtype)).name
    except ValueError:
        return f"type {int(qtype)}"


def _known(qtype: int) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(int(qtype))
    except ValueError:
        raise UnsupportedQuantTypeError(f"unknown GGML quantization type {int(qtype)}") from None


def block_size(qtype: int) -> int:
    """Logical elements per quantization block (1 for F32/F16/BF16, 32 or 256 for quant types)."""
    return GGML_QUANT_SIZES[_known(qtype)][0]


def type_size(qtype: int) -> int:
    """Bytes per quantization block."""
    return GGML_QUANT_SIZES[_known(qtype)][1]


def bytes_per_row(qtype: int, cols: int) -> int:
    """Bytes a row of ``cols`` logical elements takes; ``cols`` must be whole blocks."""
    size = block_size(qtype)
    if cols % size:
        raise ShapeMismatchError(f"a {type_name(qtype)} row of {cols} elements is not a whole number "
                                 f"of {size}-element blocks")
    return cols // size * type_size(qtype)


def check_packed(data: torch.Tensor, qtype: int, cols: int, supported) -> None:
    """Refuse, with a typed error, a type nobody decodes or bytes that do not match the shape.

    :param data: uint8 ``[rows, bytes_per_row]``.
    :param supported: the set of type names the caller can decode.
    """
    if type_name(qtype) not in supported:
        raise UnsupportedQuantTypeError(f"GGUF quantization type {type_name(qtype)} is not supported; "
                                        f"supported types: {', '.join(sorted(supported))}")
    if data.dtype != torch.uint8 or data.dim() != 2:
        raise ShapeMismatchError(f"packed {type_name(qtype)} data must be a 2-D uint8 tensor, "
                                 f"got {tuple(data.shape)} {data.dtype}")
    expected = bytes_per_row(qtype, cols)
    if data.shape[1] != expected:
        raise ShapeMismatchError(f"packed {type_name(qtype)} rows of {cols} elements take {expected} bytes, "
                                 f"got {data.shape[1]}")
