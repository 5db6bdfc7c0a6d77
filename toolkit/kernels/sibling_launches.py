"""Sibling launches: matmuls that read one input, launched one after another (a projection whose rows are stored in
segments of different quant types: the 8B Q4_K_M's q+k in Q4_K and v in Q6_K on half its layers).

Why: each segment is its own launch, and under programmatic dependent launch (``triton_pdl``) a kernel waits for the
one before it to complete before it reads anything, so the v GEMV's 1,024 rows (~4.5 us at one token on an H100,
latency more than bytes) ran only after the q+k GEMV had ended, though it needs nothing that GEMV writes. Inside
``siblings()`` a one-token GEMV whose input was written before the first sibling launched (int8 blocks its
producer attached) streams its weights at once and waits for the kernel before it only ahead of its stores
(``triton_gemv_tokens``' ``LATE_WAIT``); it still completes after that kernel, so the chain's order holds for the
kernels after it. ``TOOLKIT_PDL_SIBLINGS=0`` turns it off (read at each call, for A/B runs).

Pure Python (no Triton import): the quant schemes mark their segments with it on every device.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator

_SIBLINGS: contextvars.ContextVar[bool] = contextvars.ContextVar("toolkit_sibling_launches", default=False)


@contextlib.contextmanager
def siblings() -> Iterator[None]:
    """Mark the launches inside as siblings of the one launched just before the block: they read only what that
    one reads (or older data), nothing it writes."""
    token = _SIBLINGS.set(True)
    try:
        yield
    finally:
        _SIBLINGS.reset(token)


def in_siblings() -> bool:
    """Whether the current launch is a marked sibling (and sibling launches are not turned off)."""
    return _SIBLINGS.get() and os.environ.get("TOOLKIT_PDL_SIBLINGS", "1") != "0"
