"""Pure-torch GGUF ops: the oracle for the Triton kernels and what runs on CPU.

``data`` is always the file's packed bytes, uint8 ``[rows, bytes_per_row]``, one GGUF row of
``cols`` logical elements per tensor row; ``qtype`` is an int ``GGMLQuantizationType``.
Dequantization is bit-identical to ``gguf.quants.dequantize`` (float32) before the final cast.
"""
from __future__ import annotations

import torch

from .. import runtime
from . import iquants, kquants, legacy
from .types import block_size, check_packed, type_name, type_size

DEQUANTIZERS = {**legacy.DEQUANTIZERS, **kquants.DEQUANTIZERS, **iquants.DEQUANTIZERS}
SUPPORTED_TYPES = frozenset(DEQUANTIZERS)
FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def is_supported(qtype: int) -> bool:
    """Whether the reference ops decode this type (every op accepts exactly these)."""
    return type_name(qtype) in SUPPORTED_TYPES


def dequantize_float32(data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """``[rows, cols]`` float32, exactly gguf-py's values."""
    check_packed(data, qtype, cols, SUPPORTED_TYPES)
    rows = data.shape[0]
    blocks = data.contiguous().view(-1, type_size(qtype))
    values = DEQUANTIZERS[type_name(qtype)](blocks)
    return values.reshape(rows, cols)


def gguf_dequantize(data: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """Unpack GGUF rows into ``[rows, cols]`` of ``dtype`` (computed in float32, then cast)."""
    return dequantize_float32(data, qtype, cols).to(dtype)


def gguf_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """``x [..., cols] @ W.T -> [..., rows]`` in ``x.dtype``, W the dequantized weight.

    A float type stored in x's own dtype (the GGUF scheme casts float tensors to the compute
    dtype at load) is only reinterpreted: no copy, a plain dense matmul."""
    if FLOAT_TYPES.get(type_name(qtype)) == x.dtype and data.dim() == 2 and data.stride(-1) == 1:
        check_packed(data, qtype, cols, SUPPORTED_TYPES)
        return x @ data.view(x.dtype).T
    weight = gguf_dequantize(data, qtype, cols, x.dtype)
    return x @ weight.T


def gguf_embedding(ids: torch.Tensor, data: torch.Tensor, qtype: int, cols: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """Rows ``ids`` of the quantized table, ``[*ids.shape, cols]``; only those rows are unpacked."""
    rows = data[ids.reshape(-1).long()]
    return gguf_dequantize(rows, qtype, cols, dtype).reshape(*ids.shape, cols)


def gguf_matmul_unreduced(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """``gguf_matmul`` for a caller that can add split-K partial sums itself (``kernels/split_sums.py``). No kernel
    here splits K: the plain op's result, from whichever implementation serves ``gguf_matmul`` (the chunked CPU
    matmul on a CPU)."""
    return runtime.call("gguf_matmul", x, data, qtype, cols)


def gguf_int8_input(data: torch.Tensor, qtype: int, cols: int, tokens: int) -> None:
    """What ``gguf_matmul`` reads besides x (``kernels/int8_blocks.py``): nothing here, it takes x as it is."""
    return None


__all__ = ["SUPPORTED_TYPES", "block_size", "dequantize_float32", "gguf_dequantize", "gguf_embedding",
           "gguf_int8_input", "gguf_matmul", "gguf_matmul_unreduced", "is_supported", "type_size"]
