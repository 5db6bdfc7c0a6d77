"""Host side of the Gluon Q4_K kernel (``gluon_dot16``): which 17-64-token calls it takes from the 16-bit Triton
kernel, and its launch.

It runs only where warpgroup MMAs exist (compute capability 9.0: H100/H200) and Triton ships Gluon; anywhere else,
and with ``TOOLKIT_GGUF_GLUON=0`` (for timing both in one engine), ``dot16_matmul`` keeps ``triton_dot16``.
"""
from __future__ import annotations

import functools
import os

import torch

from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .dot16_ops import Dot16Rule, tiles_and_split

# Where it replaces the Triton kernel: ``.dev``-measured on an H100 (docs/benchmarks.md, session 19; CUDA graphs over
# weight copies beyond L2, us per weight, this kernel / ``triton_dot16`` with its rules / dense bf16):
# 28672x4096 T=32 66.5 / 72.7 / 89.2 (8 programs per SM; 67.6 at 4), T=64 88.7 / 93.9 / 89.6; 4096x14336 T=32 37.1 /
# 41.1 / 46.1 (4 per SM), T=64 48.4 / 52.0 / 47.2. At 4096x4096 it was even at 32 tokens (17.1 / 17.4) and lost at
# 64 (20.9 / 18.9), so weights of fewer than 8192 rows and 8192 columns keep the Triton kernel. Two stages of
# activations in shared memory (three: 1-5% slower), 64 rows per program over 4 warps (128 over 8: slower or even).
GLUON_RULES = (
    Dot16Rule("Q4_K", 32, (("programs_per_sm", 8),), min_cols=4096, min_rows=8192),
    Dot16Rule("Q4_K", 64, (("programs_per_sm", 8),), min_cols=4096, min_rows=8192),
    Dot16Rule("Q4_K", 32, (("programs_per_sm", 4),), min_cols=8192, min_rows=4096),
    Dot16Rule("Q4_K", 64, (("programs_per_sm", 4),), min_cols=8192, min_rows=4096),
)
GLUON_LAUNCH = {"bn": 64, "num_warps": 4, "stages": 2, "programs_per_sm": 4}


def gluon_rule(name: str, rows: int, cols: int, bm: int, device: torch.device) -> Dot16Rule | None:
    """The ``GLUON_RULES`` entry that sends this call to the Gluon kernel, or None (other types and shapes, a device
    without warpgroup MMAs, Triton without Gluon, ``TOOLKIT_GGUF_GLUON=0``, ``TOOLKIT_GGUF_DOT16_LAUNCH`` set)."""
    if os.environ.get("TOOLKIT_GGUF_GLUON", "1") == "0" or os.environ.get("TOOLKIT_GGUF_DOT16_LAUNCH") \
            or not _runs_on(device):  # a launch set for the Triton kernel times that kernel
        return None
    return next((rule for rule in GLUON_RULES if rule.holds(name, rows, cols, bm)), None)


def _runs_on(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return _capable(torch.cuda.current_device() if device.index is None else device.index) and _kernel() is not None


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)  # wgmma is sm_90a's alone (not sm_100 and later)


@functools.lru_cache(maxsize=None)
def _kernel():
    """The kernel, or None where this Triton has no Gluon (its API is Triton's experimental one)."""
    try:
        from .gluon_dot16 import gluon_q4k_kernel  # noqa: PLC0415 - Gluon only on the GPUs that run it
    except ImportError:
        return None
    return gluon_q4k_kernel


def gluon_matmul(x: torch.Tensor, data: torch.Tensor, cols: int, bm: int, rule: Dot16Rule | None = None, *,
                 bn: int | None = None, num_warps: int | None = None, stages: int | None = None,
                 programs_per_sm: int | None = None, split: int | None = None) -> torch.Tensor:
    """``x [T, cols] @ W.T`` -> ``[T, rows]`` in x's dtype for a Q4_K weight ``data [rows, cols / 256 * 144]`` (uint8,
    rows 4-byte aligned; x contiguous, fp16/bf16) with ``bm`` tokens per program; launch values from ``rule`` over
    ``GLUON_LAUNCH``, or as given (benchmarks)."""
    launch = {**GLUON_LAUNCH, **dict(rule.launch if rule is not None else ())}
    bn, num_warps = bn or launch["bn"], num_warps or launch["num_warps"]
    tokens, rows = x.shape[0], data.shape[0]
    grid_nm, split = tiles_and_split(tokens, rows, cols, bm, bn, x.device, programs_per_sm or launch["programs_per_sm"],
                                     split)
    out = split_output(split, tokens, rows, x)
    _kernel()[(*grid_nm, split)](x, data, out, tokens, rows, cols, cols // split, x.stride(0), data.stride(0), BM=bm,
                                 BN=bn, STAGES=stages or launch["stages"], num_warps=num_warps,
                                 **launch_options(x.device))
    return finish_splits(out, x.dtype)
