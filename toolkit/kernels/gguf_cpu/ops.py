"""CPU ``gguf_matmul`` / ``gguf_dequantize`` on the compiled kernels of ``gguf_cpu.cpp``.

The weights stay in the file's packed bytes; nothing is repacked or kept dequantized.

- Few activation rows (decode: ``M <= GEMV_MAX_ROWS``): one GEMV pass that decodes each block
  as it reads it. Default (AVX2): the activations are quantized to int8 per 32-element block
  (d = max|x| / 127) and the products are integer (``maddubs``), like llama.cpp; the result is
  ``W @ x_hat`` with ``|x - x_hat| <= d / 2`` per element. ``TOOLKIT_GGUF_CPU_INT8=0`` (read at
  import) keeps float32 activations, whose results equal dequantize-then-matmul up to float32
  summation order (in registers with AVX2 + FMA; through a one-row buffer in the portable build,
  which always uses float32).
- Many rows (prefill), AVX2 builds with 8-bit activations (the default): the int8 GEMM of
  ``gemm.h``. The activations are quantized once per call exactly as for the GEMV (same bytes,
  same bound); weight rows are decoded eight at a time into an L1 buffer, once per 64 tokens,
  transposed so each 32-bit lane holds one row, and an 8-row x 4-token micro-kernel does the
  integer products (maddubs/madd); the threads claim chunks of rows from a shared counter.
- Many rows otherwise (no AVX2, ``TOOLKIT_GGUF_CPU_INT8=0`` or ``TOOLKIT_GGUF_CPU_GEMM=0``): rows
  of the weight are dequantized, ``TILE_ELEMENTS`` at a time, into a reused float32 tile, and
  multiplied with ``torch.matmul`` (MKL/oneDNN), so the arithmetic runs in an optimized GEMM and
  the tile stays in cache.

Only float32 activations (the CPU default dtype) are taken: for 16-bit activations the op's
contract is the reference's (weights rounded to ``x.dtype``), which the torch path keeps.
"""
from __future__ import annotations

import os

import torch

from ..gguf.reference import SUPPORTED_TYPES
from ..gguf.types import bytes_per_row, check_packed, type_name
from . import build

# gguf-py's GGMLQuantizationType numbers of the types gguf_cpu.cpp decodes
HANDLED = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
_HANDLED_IDS = frozenset(HANDLED.values())
# 8-bit activations in the GEMV (integer dot products, results within the activation-rounding bound
# of the float path; see fused.h). Default on; TOOLKIT_GGUF_CPU_INT8=0 keeps float32 activations.
INT8_ACTIVATIONS = os.environ.get("TOOLKIT_GGUF_CPU_INT8", "1") != "0"
# More rows than GEMV_MAX_ROWS: the int8 GEMM (gemm.h, AVX2 builds) when 8-bit activations are on;
# TOOLKIT_GGUF_CPU_GEMM=0 keeps the dequantized-tile float GEMM for them (A/B measurements).
INT8_GEMM = os.environ.get("TOOLKIT_GGUF_CPU_GEMM", "1") != "0"
GEMV_MAX_ROWS = 4          # above this many activation rows, dequantize tiles and use torch.matmul
TILE_ELEMENTS = 1 << 20    # float32 elements per dequantized tile: 4 MiB (in L3); fewer, larger steps


def supports(x, data, qtype, cols, *args, **kwargs) -> bool:
    """float32 CPU activations, a handled type, and the extension built (built on first call)."""
    return (isinstance(x, torch.Tensor) and x.device.type == "cpu" and x.dtype == torch.float32
            and int(qtype) in _HANDLED_IDS and build.extension() is not None)


def supports_dequantize(data, qtype, cols, dtype, *args, **kwargs) -> bool:
    return (isinstance(data, torch.Tensor) and data.device.type == "cpu" and int(qtype) in _HANDLED_IDS
            and build.extension() is not None)


_ROW_BYTES: dict[tuple[int, int], int] = {}  # (qtype, cols) already validated -> bytes per row


def _packed_rows(data: torch.Tensor, qtype: int, cols: int) -> tuple[torch.Tensor, int]:
    """``data`` checked and with contiguous rows (a row slice of a bigger tensor already is).

    A decode step makes ~130 calls with a handful of (qtype, cols) pairs, so the type checks run
    once per pair and each call only compares the tensor's shape with the cached row size."""
    row_bytes = _ROW_BYTES.get((qtype, cols))
    if row_bytes is None or data.dtype != torch.uint8 or data.dim() != 2 or data.shape[1] != row_bytes:
        check_packed(data, qtype, cols, SUPPORTED_TYPES)
        row_bytes = _ROW_BYTES[(qtype, cols)] = bytes_per_row(qtype, cols)
    if data.stride(-1) != 1 or (data.shape[0] > 1 and data.stride(0) != row_bytes):
        data = data.contiguous()
    return data, row_bytes


def gguf_matmul_native(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """``x [..., cols] @ W.T -> [..., rows]`` in ``x.dtype``; W the packed GGUF rows ``data``.

    Registered for float32 ``x`` (see ``supports``); another dtype is computed in float32."""
    ext = build.extension()
    qtype = int(qtype)
    data, row_bytes = _packed_rows(data, qtype, cols)
    rows = data.shape[0]
    flat = x if x.dim() == 2 and x.shape[1] == cols else x.reshape(-1, cols)  # (skipping no-op torch calls: ~2 us each)
    if flat.dtype != torch.float32:
        flat = flat.to(torch.float32)
    if not flat.is_contiguous():
        flat = flat.contiguous()
    tokens = flat.shape[0]
    out = torch.empty(tokens, rows, dtype=torch.float32)
    if tokens == 0 or rows == 0:
        pass
    elif tokens <= GEMV_MAX_ROWS:
        ext.gemv(flat.data_ptr(), data.data_ptr(), out.data_ptr(), tokens, rows, cols, row_bytes, qtype,
                 INT8_ACTIVATIONS)
    elif INT8_ACTIVATIONS and INT8_GEMM and ext.gemm(flat.data_ptr(), data.data_ptr(), out.data_ptr(), tokens, rows, cols,
                                       row_bytes, qtype):
        pass  # the int8 GEMM ran (AVX2 builds); otherwise dequantized tiles and a float GEMM below
    else:
        step = max(1, min(rows, TILE_ELEMENTS // cols))
        tile = torch.empty(step, cols, dtype=torch.float32)
        for start in range(0, rows, step):
            count = min(step, rows - start)
            ext.dequantize(data[start].data_ptr(), tile.data_ptr(), count, cols, row_bytes, qtype)
            torch.matmul(flat, tile[:count].T, out=out[:, start:start + count])
    if x.dtype != torch.float32:
        out = out.to(x.dtype)
    return out.view(*x.shape[:-1], rows) if x.dim() != 2 else out


def gguf_dequantize_native(data: torch.Tensor, qtype: int, cols: int, dtype: torch.dtype) -> torch.Tensor:
    """``[rows, cols]`` of ``dtype``: the float32 values gguf-py gives, then cast."""
    data, row_bytes = _packed_rows(data, qtype, cols)
    out = torch.empty(data.shape[0], cols, dtype=torch.float32)
    if data.shape[0]:
        build.extension().dequantize(data.data_ptr(), out.data_ptr(), data.shape[0], cols, row_bytes, int(qtype))
    return out.to(dtype)


gguf_matmul_native.supports = supports
gguf_dequantize_native.supports = supports_dequantize


def handled_type_names() -> list[str]:
    return sorted(HANDLED, key=HANDLED.get)


assert all(type_name(number) == name for name, number in HANDLED.items())  # noqa: S101 - table sanity
