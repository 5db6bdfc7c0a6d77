"""Host side of the Gluon GGUF kernels (``gluon_q4_k``, ``gluon_q6_k``, ``gluon_q4_0``): which calls they take, from
the 16-bit Triton kernel (17-64 tokens) and from the int8 one (8-16 tokens), and their launch.

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
from ..launch import split_k

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
    if os.environ.get("TOOLKIT_GGUF_GLUON", "1") == "0" or os.environ.get("TOOLKIT_GGUF_DOT16_LAUNCH") \
            or not _runs_on(device):  # a launch set for the Triton kernel times that kernel
        return None
    return next((rule for rule in GLUON_RULES if rule.holds(name, rows, cols, bm, tokens)), None)


def _runs_on(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    return _capable(torch.cuda.current_device() if device.index is None else device.index) and _kernels() is not None


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
                 **launch) -> torch.Tensor:
    """``x [T, cols] @ W.T`` -> ``[T, rows]`` in x's dtype for a weight of type ``name`` (Q4_K, Q6_K or Q4_0; ``data``
    uint8 ``[rows, row bytes]``, rows 4-byte aligned for Q4_K, 2 for the others; x contiguous, fp16/bf16) with ``bm``
    tokens per program. Launch values (``GLUON_LAUNCH``'s keys: bn, num_warps, stages, programs_per_sm, group (Q4_0
    blocks per iteration), and ``split``) from ``rule`` over ``GLUON_LAUNCH``, or as given (benchmarks, tests)."""
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
    return finish_splits(out, x.dtype)


# The one-token Gluon GEMV (``gluon_gemv``) by Q4_K weight shape: (super-blocks per step, rows per thread, least rows,
# least columns, most columns), the first that holds; other shapes keep ``triton_gemv_tokens``. Session 20's H100 sweep
# (``.dev``: CUDA graphs over weight copies beyond L2, activations' blocks attached as the norms hand them), us, this
# kernel / the Triton GEMV with its rules: 28672x4096 27.3 / 31.1 (81% / 71% of a device copy), 5120x4096 7.1 / 7.4,
# 4096x4096 6.4 / 6.6, 16384x2048 10.8 / 11.3, 2560x2048 3.1 / 3.4, 2048x2048 2.8 / 3.1, 1024x4096 3.0 / 2.9 (eight
# super-blocks, two rows per thread); 4096x14336 16.3 / 17.2 (four and four, K in two). Lost: 2048x8192 (7.2 / 6.7 at
# best). A second sweep (same session) had four rows per thread ahead on the gate/up weights: 28672x4096 26.7 against
# 27.2, 16384x2048 9.7 / 10.3, and behind or even on the others (1024x4096 3.4 / 3.1, 4096x4096 6.3 / 6.2).
# ``TOOLKIT_GGUF_GLUON_GEMV=0`` keeps the Triton GEMV; ``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH=sb,rows per thread,warps,
# split`` (split 0: the rule's) sets the launch (benchmarks).
GEMV_RULES = ((8, 4, 16384, 0, 4096), (8, 2, 0, 0, 4096), (4, 4, 4096, 8192, 1 << 40))


def gemv_launch(name: str, data: torch.Tensor, cols: int,
                *vectors: torch.Tensor) -> tuple[int, int, int, int] | None:
    """The Gluon GEMV's ``(super-blocks per step, rows per thread, warps, K split)`` for the one-token call of type
    ``name`` on ``data`` (split 0: the caller's), or None (the Triton GEMV): Q4_K of a shape ``GEMV_RULES`` take,
    16-byte-aligned rows and ``vectors`` (the activations' blocks: it loads them 8 and 16 bytes at a time), a
    Gluon-capable device, not turned off."""
    if (name != "Q4_K" or os.environ.get("TOOLKIT_GGUF_GLUON_GEMV", "1") == "0" or not _runs_on(data.device)
            or any(t.data_ptr() % 16 for t in (data, *vectors)) or data.stride(0) % 16 or cols % 256):
        return None
    forced = os.environ.get("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH")
    if forced:
        return tuple(int(v) for v in (forced.split(",") + ["0"])[:4])
    rows = data.shape[0]
    return next(((sb, rpt, 1, 0) for sb, rpt, min_rows, min_cols, max_cols in GEMV_RULES
                 if rows >= min_rows and min_cols <= cols <= max_cols), None)


def _gemv_rows(sb_step: int, rpt: int, warps: int) -> int:
    """Rows per program of the Gluon GEMV (its kernel's ``ROWS``)."""
    return rpt * (32 // (4 * sb_step)) * warps


def gluon_gemv(words: torch.Tensor, scales: torch.Tensor, sums: torch.Tensor, data: torch.Tensor, cols: int,
               x: torch.Tensor, launch: tuple[int, int, int, int], split: int | None,
               unreduced: bool = False) -> torch.Tensor:
    """``x [1, cols] @ W.T`` for a Q4_K weight ``data [rows, row bytes]`` from x's int8 blocks (``words``, ``scales``,
    ``sums``: ``dp4a_ops.activation_blocks``) with ``launch`` (``gemv_launch``'s); ``[1, rows]`` in x's dtype, or its
    split-K partial sums with ``unreduced`` (``triton_reduce.finish_splits``). ``split``: K cut in as many where the
    launch gives none (None: automatic); fewer super-blocks per step where they do not divide a split's."""
    from .gluon_gemv import gluon_gemv_q4k_kernel  # noqa: PLC0415 - Gluon only on the GPUs that run it
    sb_step, rpt, warps, forced = launch
    rows, blocks = data.shape[0], cols // 256
    split = forced or split or split_k(-(-rows // _gemv_rows(sb_step, rpt, warps)), blocks // sb_step or 1, x.device)
    while blocks % split:
        split -= 1
    while (blocks // split) % sb_step:
        sb_step //= 2
    out = split_output(split, 1, rows, x)
    grid_n = -(-rows // _gemv_rows(sb_step, rpt, warps))
    gluon_gemv_q4k_kernel[(grid_n, split)](words, scales, sums, data, out, rows, cols // split, data.stride(0),
                                           SB_STEP=sb_step, RPT=rpt, num_warps=warps, **launch_options(x.device))
    return finish_splits(out, x.dtype, unreduced)
