"""Host side of the one-token Gluon GEMV (``gluon_gemv``: Q4_K and Q5_K, ``gluon_gemv_q6k``: Q6_K,
``gluon_gemv_q4_0``: Q4_0 and, with ``gluon_gemv_q8_0``'s group, Q8_0): which calls it takes from the Triton GEMV
(``triton_gemv_tokens``, through ``dp4a_ops``) and its launch.

The kernels give each thread whole 64-column pieces (Q4_K, Q5_K: a group of one super-block; Q6_K: a piece of each of a
group of eight; Q4_0, Q8_0: two blocks of a group of eight), four threads to a unit, and walk ``step`` units per loop
iteration; a program holds ``rows per thread x 32 / (4 step) x warps`` rows.
"""
from __future__ import annotations

import functools
import os

import torch

from ..launch import split_k
from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .gluon_ops import _runs_on

# Columns one unit of ``step`` covers: a Q4_K super-block; eight Q6_K super-blocks, eight Q4_0 blocks (the kernels'
# 16-byte-aligned groups).
UNIT_COLUMNS = {"Q4_K": 256, "Q5_K": 256, "Q6_K": 2048, "Q4_0": 256, "Q8_0": 256}
Q6K_REGISTERS = 64   # the Q6_K register cap of session 35 (below); no rule takes it since session 39
# The launch by weight shape: (units per step, rows per thread, warps, K split (0: the caller's), register cap (0:
# none), least rows, least columns, most columns), the first that holds; other shapes keep ``triton_gemv_tokens``.
# Q4_K, session 20's H100 sweep (``.dev``: CUDA graphs over weight copies beyond L2, activations' blocks attached as the
# norms hand them), us, this kernel / the Triton GEMV with its rules: 28672x4096 27.3 / 31.1 (81% / 71% of a device
# copy), 5120x4096 7.1 / 7.4, 4096x4096 6.4 / 6.6, 16384x2048 10.8 / 11.3, 2560x2048 3.1 / 3.4, 2048x2048 2.8 / 3.1,
# 1024x4096 3.0 / 2.9 (eight super-blocks, two rows per thread); 4096x14336 16.3 / 17.2 (four and four, K in two as
# the Triton GEMV's rule cuts it). Lost: 2048x8192 (7.2 / 6.7 at best). A second sweep (same session) had four rows per
# thread ahead on the gate/up weights: 28672x4096 26.7 against 27.2, 16384x2048 9.7 / 10.3, and behind or even on the
# others (1024x4096 3.4 / 3.1, 4096x4096 6.3 / 6.2). Session 24 (same method, three calls): four warps with K not
# split won at 4096x14336 (eight super-blocks, four rows per thread: 15.6-16.1 against 15.9-17.3 at the rule before,
# 69-71% of a device copy) and at 2,048 columns from 2,048 rows (2048x2048 2.0 / 2.4-2.5, 2560x2048 2.2 / 2.8,
# 2304x2048 2.1 / 2.6); even elsewhere (16384x2048, 28672x4096, 4096x4096, 1024x4096). Engine A/B, batch 1, fresh
# processes, two rounds: 1.5B Q4_K_M 1,183.1 / 1,082.3 against 1,064.1 / 1,064.7 tok/s, 8B Q4_K_M 404.6 / 405.4
# against 405.9 / 405.6 (even).
# Q6_K (2,048-column multiples only: 16-byte-aligned rows), session 21's H100 sweep (same method), us, this kernel /
# the Triton GEMV with its rules: 4096x14336 24.7-24.9 / 28.8-29.4 (64-65% / 55-56% of a device copy), 128256x4096
# 172.4-173.2 / 197.4-199.7 (83% / 72%), 14336x4096 23.3-23.7 / 27.5-28.3, at one group of eight super-blocks per
# thread and step, one row per thread, K cut in as many as divide the groups up to 7 (all of a 14,336-column row's);
# the Triton GEMV keeps 4096x4096 (11.4 against 10.1-10.7) and 1024x4096 (7.9 at best against 4.4). Two rows per
# thread, two groups per step, two and four warps were slower or even.
# Q4_0 (256-column multiples), session 23's H100 sweeps (same method, two calls), us, this kernel at its rule / the
# Triton GEMV: 4096x14336 14.4-14.9 / 16.2-16.7 (74-76% / 66-68% of a device copy), 14336x4096 14.8-14.9 / 15.2-15.7,
# 28672x4096 25.8 / 27.0-28.3, 16384x2048 8.9-9.5 / 10.9-11.7, 3072x2048 2.9-3.0 / 3.7-3.9, 2048x2048 2.5-2.6 /
# 2.7-2.8, 4096x4096 5.8 / 6.3; 2048x8192 even (5.9-6.0 / 5.8-6.1). Up to 4,096 columns: eight groups per step, two
# rows per thread and four warps (one-warp programs are 32 to an SM at most: 16384x2048 11.3-11.9 at one warp); from
# 8,192 columns one row per thread, one warp, K split as ``split_k`` picks. Engine A/B, 1.5B Q4_0 at batch 1 (fresh
# processes, two rounds): 1,302.5 / 1,309.2 against 1,194.7 / 1,193.0 tok/s with the Triton GEMV.
# Q5_K (the Q4_K kernel with its fifth bits), session 24's H100 sweep (same method), us, this kernel at eight
# super-blocks per step, two rows per thread, four warps / the Triton GEMV: 4096x14336 18.0 / 20.3 (75% / 66% of a
# device copy), 14336x4096 17.8 / 20.9 (75% / 64%), 28672x4096 31.6 / 36.0 (85% / 75%), 4096x4096 6.3 / 8.4,
# 16384x2048 10.9 / 14.5, 2048x2048 2.3 / 3.6, 2048x8192 7.5 / 8.0, 1024x4096 3.1 / 3.5: ahead or even at every shape
# of nine launches tried (one warp: 4096x14336 19.2-22.7). Engine A/B, 1.5B Q5_K_M at batch 1 (fresh processes, two
# rounds): 1,079.3 / 1,081.9 against 891.2 / 890.4 tok/s with the Triton GEMV.
# Register caps (the launch's fifth number, ptxas' ``.maxnreg``; 0: the compiler's count). The Q6_K kernel at its rule
# takes 74 registers, so 25 of its one-warp programs fit an SM (64K registers, allocated 256 at a time per warp; session
# 25 counted 28, leaving out the rounding) and a 4096x14336 or 14336x4096 weight (3,584 programs: 512 or 1,792 row
# blocks x the K split of 7 or 2) runs 1.09 waves on 132 SMs, the last 284 programs alone. Capped at
# ``Q6K_REGISTERS`` = 64 (no spills: tests/test_gluon_gemv.py runs ptxas) an SM holds 32, the most one-warp programs
# it takes, and the grid would be one wave (4,224 places).
# Session 35's H100 timing (bench/bench_gguf_kernels.py, the launch forced, two rounds, us, no cap / 64 / 72): that
# one wave bought nothing, 4096x14336 25.5-25.6 / 25.5-25.6 / 26.5, 14336x4096 24.5-24.6 / 24.6-24.8 / 25.6, and the
# 8B head 128256x4096 172.6-173.5 / 175.2-175.5 / 180.7; but the 1.5B head 32000x2048 (4,000 programs of one group
# of eight: 1.21 waves uncapped, one capped) 29.3-30.0 / 26.1-26.2 / 28.9, 61% -> 69% of a device copy. So only
# 2,048-column weights take the cap. Engine A/B (fresh processes, two rounds, mean TPOT at batch 1): 1.5B Q4_K_M
# 0.870-0.874 against 0.877-0.878 ms; the 8B (no Q6_K weight of 2,048 columns) 2.487-2.488 against 2.489-2.490.
# The Q4_K launches spill under any cap that would add a program per SM (four rows per thread: 104 registers,
# spilling at 96).
# Session 36: the Q6_K scales from aligned windows (``gluon_gemv_q6k._window_scales``; 68 registers uncapped, 20 bytes
# spilled under the 64 cap, so capped launches keep the byte loads). H100, GEMV alone (partial sums handed on), us,
# windows and byte loads, uncapped: 4096x14336 20.8 and 21.7, 14336x4096 21.0 and 21.9. With an explicit 255-register
# ceiling (``.maxnreg 255``, which changes ptxas' schedule though no cap binds): 22.2 and 22.5, 21.7 and 22.5, but
# the 8B head 128256x4096 151.8 and 152.7 against 158.3 and 164.5 uncapped. So heads (65,536+ rows: vocabularies;
# 14,336 rows were slower with it) take that ceiling. Engine A/B (8B Q4_K_M, batch 1, fresh processes, two rounds,
# mean TPOT): 2.442-2.443 against 2.461-2.466 ms.
# Session 37: the Q4_K/Q5_K super-block header as one 16-byte load (``gluon_gemv._header16``) instead of two 8-byte
# ones. H100, GEMV alone (partial sums handed on, three rounds), us, before / after: Q4_K 4096x14336 16.0-17.1 /
# 15.1-15.4, 14336x4096 15.0-15.6 / 14.0-14.5, 28672x4096 25.9-26.2 / 25.5-25.7, 4096x4096 5.9-6.0 / 5.7, 16384x2048
# 9.1 / 9.1; Q5_K 4096x14336 18.0 / 16.5-16.6, 14336x4096 17.3-17.4 / 16.7-16.8, 4096x4096 6.1-6.2 / 5.4, 16384x2048
# 10.6 / 10.7-10.8. Outputs torch.equal. The rules did not change.
# Session 38: Q4_0's first group loaded before the PDL wait (``gluon_gemv_q4_0``'s ``EARLY``; H200, us, before / after:
# 14336x4096 12.3 / 10.8, 16384x2048 8.3 / 7.3, 4096x14336 13.8 / 13.2; 1.5B Q4_0 batch-1 TPOT 0.726 / 0.668 ms). The
# same idea for Q6_K as an L2 prefetch of the first group (its loads do not fit in registers ahead of the wait) was
# 23% slower (4096x14336 16.9 / 20.7 us) and is not kept.
# Session 39: the launches swept again at the decode shapes, on an H100 and an H200 (``.dev/s39/sweep.py``: the GEMV
# alone with its partial sums handed on, x's blocks made once, CUDA graphs over weight copies beyond L2, three rounds
# in turns, 11-19 launches per type and shape; device copy 3,017 and 4,221 GB/s). Taken into these rules where both
# GPUs had the launch ahead; us, H100 then H200, the slowest of three rounds at the launch / the fastest at the rule
# before:
# - Q4_0 of at most 2,048 columns from 2,048 rows (under 8,192), four rows per thread and four warps: 2048x2048
#   1.85 / 1.98, 1.69 / 1.83 (16384x2048 and 32000x2048 kept two rows: 9.44 / 9.24 on the H100); of 8,192 columns
#   two rows per thread, one warp, K cut in two: 2048x8192 5.38 / 5.85, 4.72 / 5.18 (4096x14336 lost: 15.9 / 14.9 on
#   the H100);
# - Q4_K of 2,048 columns from 8,192 rows, two rows per thread, four warps, K not split: 16384x2048 9.02 / 9.49,
#   7.93 / 8.26, 32000x2048 15.18 / 15.43, 12.75 / 12.98; from 2,048 rows four rows, one warp: 2048x2048 1.97 / 2.05,
#   1.73 / 1.83 (the rule before, four warps and K not split, came from session 24's sweep);
# - Q5_K of 8,192 columns with K cut in two: 2048x8192 5.55 / 6.62, 4.85 / 5.78 (4096x14336 even or behind: 17.0 /
#   17.0, 13.6 / 12.9);
# - Q6_K of 2,048 columns with the 255-register ceiling instead of the 64 cap: from 24,576 rows (heads) one row per
#   thread, 32000x2048 23.41 / 25.11, 19.49 / 20.55; from 8,192 rows two rows, 16384x2048 14.24 / 15.10, 11.83 /
#   12.93. The cap's one-wave grid (above) no longer pays since the scales come from windows (session 36), which
#   the cap would spill; ``Q6K_REGISTERS`` stays for launches given by hand.
# Shapes where only the H200 had a launch ahead are in ``DEVICE_GEMV_RULES`` below. No engine A/B of these rules: the
# session's device time ran out (docs/benchmarks.md, session 39).
# Q8_0 (session 40: ``gluon_gemv_q8_0``'s group in the Q4_0 kernel) has no rule yet, so ``gemv_launch`` never takes
# it: the kernel was built and checked without a GPU (PTX structure, ptxas without spills, its asm's word picking
# against gguf-py's bytes in an emulator) and has not run on one, its numerics against gguf-py or its speed against
# the Triton GEMV (61-65% of copy on an H200, 72-79% on an H100): its Status docstring says what run is owed.
# ``bench/sweep_gluon_gemv.py`` sweeps launches against the Triton GEMV and proposes rules, ``bench/ab_gemv_rules.py``
# runs the engine with them.
# ``TOOLKIT_GGUF_GLUON_GEMV=0`` keeps the Triton GEMV, ``=Q4_K`` (type names, comma-separated) keeps it for the other
# types; ``TOOLKIT_GGUF_GLUON_GEMV_LAUNCH=step,rows per thread,warps,split[,registers]`` (split 0: the rule's;
# registers 0 or left out: no cap) sets the launch of every shape, also of a type with no rule yet (benchmarks).
GEMV_RULES = {
    "Q4_K": ((8, 2, 4, 1, 0, 8192, 2048, 2048), (8, 4, 1, 0, 0, 2048, 2048, 2048), (8, 4, 1, 0, 0, 16384, 0, 4096),
             (8, 4, 4, 1, 0, 2048, 0, 2048), (8, 2, 1, 0, 0, 0, 0, 4096), (8, 4, 4, 1, 0, 4096, 8192, 1 << 40)),
    "Q5_K": ((8, 2, 4, 2, 0, 0, 8192, 8192), (8, 2, 4, 0, 0, 0, 0, 1 << 40)),
    "Q6_K": ((1, 1, 1, 7, 0, 4096, 8192, 1 << 40), (1, 1, 1, 7, 255, 24576, 2048, 2048),
             (1, 2, 1, 7, 255, 8192, 2048, 2048), (1, 1, 1, 7, 255, 65536, 4096, 1 << 40),
             (1, 1, 1, 7, 0, 8192, 4096, 1 << 40)),
    "Q4_0": ((8, 2, 4, 0, 0, 8192, 0, 2048), (8, 4, 4, 0, 0, 2048, 0, 2048), (8, 2, 1, 2, 0, 0, 8192, 8192),
             (8, 2, 4, 0, 0, 0, 0, 4096), (8, 1, 1, 0, 0, 0, 8192, 1 << 40)),
}

# Launches one GPU model measured faster than ``GEMV_RULES``' (same format), tried before them on a GPU whose name holds
# the key; shapes outside their bounds keep ``GEMV_RULES``. ``TOOLKIT_GGUF_GLUON_DEVICE_RULES=0`` leaves them out (read
# at each call, for A/B runs).
# H200, session 39's sweep (above). The H200 streams 40% faster than the H100 with the same 132 SMs, and programs of
# more rows (more bytes in flight each) won there where the H100 kept its launch. us, H200 then H100, the slowest of
# three rounds at the launch / the fastest at ``GEMV_RULES``' launch before session 39:
# - Q4_0 of at most 2,048 columns from 2,048 rows, four rows per thread and four warps: 16384x2048 7.59 / 7.82 (H100
#   9.44 / 9.24), 32000x2048 12.03 / 12.58 (15.70 / 15.57); of 12,288 columns and more two rows, four warps, K cut in
#   two: 4096x14336 12.41 / 13.34 (15.43 / 14.92);
# - Q5_K up to 4,096 columns from 2,048 rows, four rows per thread, one warp: 2048x2048 1.99 / 2.11 (2.26 / 2.27),
#   16384x2048 9.50 / 9.94 (11.21 / 11.03), 32000x2048 14.21 / 16.15 (18.61 / 18.28), 14336x4096 13.75 / 14.46
#   (17.25 / 16.90), 128256x4096 83.89 / 94.02 (4096x14336 and 2048x8192 lost: 15.8 / 12.9, 7.0 / 5.8).
# Q4_K 4096x14336, Q6_K 4096x14336 and 14336x4096: no launch of the sweep more than 2.5% ahead on either GPU (fastest
# rounds).
DEVICE_GEMV_RULES = {
    "H200": {
        "Q4_0": ((8, 4, 4, 0, 0, 2048, 0, 2048), (8, 2, 4, 2, 0, 2048, 12288, 1 << 40)),
        "Q5_K": ((8, 4, 1, 0, 0, 2048, 0, 4096),),
    },
}


def gemv_launch(name: str, data: torch.Tensor, cols: int,
                *vectors: torch.Tensor) -> tuple[int, int, int, int, int] | None:
    """The Gluon GEMV's ``(units per step, rows per thread, warps, K split, register cap)`` for the one-token call of
    type ``name`` on ``data`` (split 0: the caller's; cap 0: none), or None (the Triton GEMV): a type and shape
    ``GEMV_RULES`` take (``DEVICE_GEMV_RULES``' first on the GPU models they name), rows of whole units on 16-byte
    boundaries and ``vectors`` (the activations' blocks: it loads them 8 and 16 bytes at a time), a Gluon-capable
    device, not turned off."""
    forced = os.environ.get("TOOLKIT_GGUF_GLUON_GEMV_LAUNCH")
    if (name not in (UNIT_COLUMNS if forced else GEMV_RULES) or not _turned_on(name)
            or not _runs_on(data.device, _gemv_kernels) or any(t.data_ptr() % 16 for t in (data, *vectors))
            or data.stride(0) % 16 or cols % UNIT_COLUMNS[name]):
        return None
    if forced:   # any type with a kernel, a rule or not (benchmarks: a type's launches timed before it has rules)
        return tuple(int(v) for v in (forced.split(",") + ["0", "0"])[:5])
    rows = data.shape[0]
    rules = _device_rules(data.device).get(name, ()) + GEMV_RULES[name]
    return next((tuple(launch) for *launch, min_rows, min_cols, max_cols in rules
                 if rows >= min_rows and min_cols <= cols <= max_cols), None)


def _device_rules(device: torch.device) -> dict:
    """``DEVICE_GEMV_RULES``' launches for ``device``'s GPU model (empty where none are measured, or turned off)."""
    if os.environ.get("TOOLKIT_GGUF_GLUON_DEVICE_RULES", "1") == "0":
        return {}
    name = _device_name(device)
    return next((rules for key, rules in DEVICE_GEMV_RULES.items() if key in name), {})


@functools.lru_cache(maxsize=None)
def _device_name(device: torch.device) -> str:
    """The GPU model's name (``torch.cuda.get_device_name``; "" off CUDA): one driver query per device."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else ""


@functools.lru_cache(maxsize=None)
def _gemv_kernels():
    """Type name -> the one-token Gluon kernel, or None where this Triton has no Gluon (its API is Triton's
    experimental one). Imported at the first one-token call: only these modules, not the MMA kernels of 8+ tokens
    (``gluon_ops._kernels``), whose ``@jit`` definitions a decode would otherwise pay for (each reads its source)."""
    try:  # noqa: PLC0415 - Gluon only on the GPUs that run it
        from .gluon_gemv import gluon_gemv_q4k_kernel
        from .gluon_gemv_q4_0 import gluon_gemv_q4_0_kernel
        from .gluon_gemv_q6k import gluon_gemv_q6k_kernel
    except ImportError:
        return None
    return {"Q4_K": gluon_gemv_q4k_kernel, "Q5_K": gluon_gemv_q4k_kernel, "Q6_K": gluon_gemv_q6k_kernel,
            "Q4_0": gluon_gemv_q4_0_kernel, "Q8_0": gluon_gemv_q4_0_kernel}


def _early_weights() -> bool:
    """Whether the Q4_0 kernel loads its first group's weights before its PDL wait (``gluon_gemv_q4_0``'s ``EARLY``);
    ``TOOLKIT_GGUF_GLUON_EARLY=0`` turns it off (read at each call, for A/B runs)."""
    return os.environ.get("TOOLKIT_GGUF_GLUON_EARLY", "1") != "0"


def _turned_on(name: str) -> bool:
    setting = os.environ.get("TOOLKIT_GGUF_GLUON_GEMV", "1")
    return setting == "1" or name in setting.split(",")


def _gemv_rows(step: int, rpt: int, warps: int) -> int:
    """Rows per program of the Gluon GEMV (its kernels' ``ROWS``)."""
    return rpt * (32 // (4 * step)) * warps


def gluon_gemv(name: str, words: torch.Tensor, scales: torch.Tensor, sums: torch.Tensor | None, data: torch.Tensor,
               cols: int, x: torch.Tensor, launch: tuple[int, ...], split: int | None,
               unreduced: bool = False) -> torch.Tensor:
    """``x [1, cols] @ W.T`` for a weight ``data [rows, row bytes]`` of type ``name`` from x's int8 blocks (``words``,
    ``scales``, ``sums`` (Q4_K's): ``dp4a_ops.activation_blocks``) with ``launch`` (``gemv_launch``'s); ``[1, rows]``
    in x's dtype, or its split-K partial sums with ``unreduced`` (``triton_reduce.finish_splits``). ``split``: K cut
    in as many where the launch gives none (None: automatic), else the most that divides the units (cut to fewer);
    fewer units per step where they do not divide a split's. A launch of four numbers has no register cap."""
    step, rpt, warps, forced, registers = (*launch, 0)[:5]
    rows, units = data.shape[0], cols // UNIT_COLUMNS[name]
    split = forced or split or split_k(-(-rows // _gemv_rows(step, rpt, warps)), units // step or 1, x.device)
    while units % split:
        split -= 1
    while (units // split) % step:
        step //= 2
    out = split_output(split, 1, rows, x)
    grid = (-(-rows // _gemv_rows(step, rpt, warps)), split)
    common = dict(RPT=rpt, num_warps=warps, **launch_options(x.device))
    if registers:
        common["maxnreg"] = registers
    kernel = _gemv_kernels()[name]
    if name in ("Q4_K", "Q5_K"):
        kernel[grid](words, scales, sums, data, out, rows, cols // split, data.stride(0), SB_STEP=step,
                     Q5=name == "Q5_K", **common)
    elif name == "Q6_K":  # under the 64-register cap the scale windows spill: such launches keep the byte loads
        kernel[grid](words, scales, data, out, rows, cols // split, data.stride(0), GROUPS=step,
                     SCALE_WINDOWS=not registers or registers > Q6K_REGISTERS, **common)
    else:  # Q4_0, Q8_0
        kernel[grid](words, scales, data, out, rows, cols // split, data.stride(0), GROUPS=step, EARLY=_early_weights(),
                     Q8=name == "Q8_0", **common)
    return finish_splits(out, x.dtype, unreduced)
