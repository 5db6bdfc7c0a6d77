"""The int8 block rounding of ``kernels/int8_blocks.py`` as Triton functions, for the kernels that
write the blocks: the GGUF activation quantizer and the fused norm / gated-activation kernels that
produce them with their own output (one definition, so every writer rounds identically)."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def round_int8_blocks(x):
    """``x [G, 32]`` float32 -> ``(q [G, 32] int32 in -127..127, d [G] float32)``: ``d = max|x| / 127``,
    ``q = x * (127 / max|x|)`` rounded half away from zero (0 for an all-zero block)."""
    amax = tl.max(tl.abs(x), axis=1)
    inv = tl.where(amax > 0, 127.0 / amax, 0.0)
    scaled = x * inv[:, None]
    return tl.where(scaled >= 0, scaled + 0.5, scaled - 0.5).to(tl.int32), amax / 127.0


@triton.jit
def store_int8_blocks(x, block0, q_ptr, d_ptr, s_ptr, n_blocks, G: tl.constexpr, SUMS: tl.constexpr):
    """Round ``x [G * 32]`` (float32: a row's blocks ``block0 .. block0 + G - 1``) and store the blocks
    below ``n_blocks``: int8 values at ``q_ptr`` (the row's int8 array), scales at ``d_ptr`` and with
    ``SUMS`` the sums ``d * sum(q)`` at ``s_ptr`` (the row's float32 arrays, one value per block)."""
    q, d = round_int8_blocks(tl.reshape(x, (G, 32)))
    g = block0 + tl.arange(0, G)
    ok = g < n_blocks
    tl.store(q_ptr + g[:, None] * 32 + tl.arange(0, 32)[None, :], q.to(tl.int8), mask=ok[:, None])
    tl.store(d_ptr + g, d, mask=ok)
    if SUMS:
        tl.store(s_ptr + g, tl.sum(q, axis=1).to(tl.float32) * d, mask=ok)
