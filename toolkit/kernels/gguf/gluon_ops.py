"""Host side of the Gluon GGUF matmul kernels (``gluon_q4_k``, ``gluon_q6_k``, ``gluon_q4_0``): which calls they
take, from the 16-bit Triton kernel (17-64 tokens) and from the int8 one (8-16 tokens), and their launch. The
one-token Gluon GEMV's host side is ``gluon_gemv_ops``.

They run only where warpgroup MMAs exist (compute capability 9.0: H100/H200) and Triton ships Gluon; anywhere else,
and with ``TOOLKIT_GGUF_GLUON=0`` (for timing both in one engine), ``dot16_matmul`` keeps ``triton_dot16``.
"""
from __future__ import annotations

import functools
import os

import torch

from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .dot16_ops import Dot16Rule, tiles_and_split

# Where they replace the Triton kernel, from session 19's H100 sweeps (docs/benchmarks.md; CUDA graphs over weight
# copies beyond L2, us per weight, Gluon / ``triton_dot16`` with its rules / dense bf16):
# - Q4_K: 28672x4096 T=32 66.5 / 72.7 / 89.2 (8 programs per SM; 67.6 at 4), T=64 88.7 / 93.9 / 89.6; 4096x14336
#   T=32 37.1 / 41.1 / 46.1 (4 per SM), T=64 48.4 / 52.0 / 47.2. At 4096x4096 it was even at 32 tokens (17.1 / 17.4)
#   and lost at 64 (20.9 / 18.9), so weights of fewer than 8192 rows and 8192 columns keep the Triton kernel.
# - Q6_K, every shape: 4096x14336 T=32 42.8 / 59.8 / 46.3, T=64 57.8 / 82.9 / 47.5; 128256x4096 T=32 293.3 / 451.7 /
#   381.0, T=64 407.7 / 696.1 / 391.1 (4 per SM; 2 and 8 within 1-6%, three stages 1-4% slower).
# - Q4_0, every shape, four blocks per iteration: at T=32 16384x2048 32.0 / 50.9 / 27.1, 2048x8192 21.6 / 30.8 / 16.9,
#   3072x2048 13.5 / 17.1 / 7.8, 2048x2048 9.2 / 12.6 / 6.6; at T=64 with three stages of activations (1-10% faster
#   than two there) 29.6 / 43.5 / 27.9, 19.8 / 27.7 / 17.5, 12.8 / 14.1 / 8.0, 12.6 / 13.5 / 6.8.
# - 8-16 tokens (16-token tiles, below the Triton kernel's 17): engine A/B on the H100 against the int8 kernel
#   (``triton_mmq``), two rounds each, tok/s: 8B Q4_K_M batch 8 1,534 / 1,531 against 1,422 / 1,409, batch 16 2,999 /
#   2,994 against 2,064 / 2,064; 1.5B Q4_0 batch 16 8,318 / 8,249 against 6,656 / 6,637, but batch 8 4,246 / 3,635
#   against 5,133 / 5,093: Q4_0 from 9 tokens, Q4_K and Q6_K from 8. Fewer tokens were not measured.
# Two stages elsewhere, 64 rows per program over 4 warps (128 over 8: slower or even).
GLUON_RULES = (
    Dot16Rule("Q4_K", 32, (("programs_per_sm", 8),), min_cols=4096, min_rows=8192),
    Dot16Rule("Q4_K", 64, (("programs_per_sm", 8),), min_cols=4096, min_rows=8192),
    Dot16Rule("Q4_K", 32, (), min_cols=8192, min_rows=4096),
    Dot16Rule("Q4_K", 64, (), min_cols=8192, min_rows=4096),
    Dot16Rule("Q6_K", 32, ()),
    Dot16Rule("Q6_K", 64, ()),
    Dot16Rule("Q4_0", 32, ()),
    Dot16Rule("Q4_0", 64, (("stages", 3),)),
    Dot16Rule("Q4_K", 16, (), min_tokens=8),
    Dot16Rule("Q6_K", 16, (), min_tokens=8),
    Dot16Rule("Q4_0", 16, (), min_tokens=9),
)
GLUON_LAUNCH = {"bn": 64, "num_warps": 4, "stages": 2, "programs_per_sm": 4, "group": 4}


def gluon_rule(name: str, rows: int, cols: int, bm: int, device: torch.device, tokens: int = 0) -> Dot16Rule | None:
    """The ``GLUON_RULES`` entry that sends this call to a Gluon kernel, or None (other types and shapes, a device
    without warpgroup MMAs, Triton without Gluon, ``TOOLKIT_GGUF_GLUON=0``, ``TOOLKIT_GGUF_DOT16_LAUNCH`` set)."""
    if os.environ.get("TOOLKIT_GGUF_GLUON", "1") == "0" or os.environ.get("TOOLKIT_GGUF_DOT16_LAUNCH"):
        return None  # a launch set for the Triton kernel times that kernel
    rule = next((rule for rule in GLUON_RULES if rule.holds(name, rows, cols, bm, tokens)), None)
    # the device check last: it imports the kernels, which a call no rule takes (a decode's) never launches
    return rule if rule is not None and _runs_on(device) else None


def _runs_on(device: torch.device, kernels=None) -> bool:
    """An sm_90 GPU, and the Gluon kernels ``kernels()`` imports (default: this module's, ``_kernels``) imported
    without error. Each family passes its own: a one-token decode imports only its GEMV's modules, not these."""
    if device.type != "cuda":
        return False
    return (_capable(torch.cuda.current_device() if device.index is None else device.index)
            and (kernels or _kernels)() is not None)


@functools.lru_cache(maxsize=None)
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)  # wgmma is sm_90a's alone (not sm_100 and later)


@functools.lru_cache(maxsize=None)
def _kernels():
    """Type name -> kernel, or None where this Triton has no Gluon (its API is Triton's experimental one)."""
    try:  # noqa: PLC0415 - Gluon only on the GPUs that run it
        from .gluon_q4_0 import gluon_q40_kernel
        from .gluon_q4_k import gluon_q4k_kernel
        from .gluon_q6_k import REGISTER_CAP, gluon_q6k_kernel
    except ImportError:
        return None
    return {"Q4_K": (gluon_q4k_kernel, {}), "Q6_K": (gluon_q6k_kernel, REGISTER_CAP), "Q4_0": (gluon_q40_kernel, {})}


def gluon_matmul(x: torch.Tensor, data: torch.Tensor, name: str, cols: int, bm: int, rule: Dot16Rule | None = None,
                 unreduced: bool = False, **launch) -> torch.Tensor:
    """``x [T, cols] @ W.T`` -> ``[T, rows]`` in x's dtype for a weight of type ``name`` (Q4_K, Q6_K or Q4_0; ``data``
    uint8 ``[rows, row bytes]``, rows 4-byte aligned for Q4_K, 2 for the others; x contiguous, fp16/bf16) with ``bm``
    tokens per program. Launch values (``GLUON_LAUNCH``'s keys: bn, num_warps, stages, programs_per_sm, group (Q4_0
    blocks per iteration), and ``split``) from ``rule`` over ``GLUON_LAUNCH``, or as given (benchmarks, tests).
    ``unreduced``: split-K partial sums returned as they are (``finish_splits``)."""
    values = {**GLUON_LAUNCH, **dict(rule.launch if rule is not None else ()),
              **{key: value for key, value in launch.items() if value is not None}}
    kernel, register_cap = _kernels()[name]
    tokens, rows = x.shape[0], data.shape[0]
    grid_nm, split = tiles_and_split(tokens, rows, cols, bm, values["bn"], x.device, values["programs_per_sm"],
                                     values.get("split"))
    out = split_output(split, tokens, rows, x)
    extra = {"GROUP": values["group"]} if name == "Q4_0" else {}
    if bm in register_cap:
        extra["maxnreg"] = register_cap[bm]
    kernel[(*grid_nm, split)](x, data, out, tokens, rows, cols, cols // split, x.stride(0), data.stride(0), BM=bm,
                              BN=values["bn"], STAGES=values["stages"], num_warps=values["num_warps"],
                              **launch_options(x.device), **extra)
    return finish_splits(out, x.dtype, unreduced)
