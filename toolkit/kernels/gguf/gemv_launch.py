"""Launches of the token-unrolled dp4a GEMV (``triton_gemv_tokens``): which tokens each type sends to it, and
its launch per (type, tokens, weight shape), all measured (``bench/bench_gguf_kernels.py --sweep``, H100).
"""
from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class GemvConfig:
    """A dp4a GEMV launch: ``BN`` rows per program, ``BK`` columns per step, ``split`` K (None:
    automatic)."""
    bn: int
    bk: int
    num_warps: int = 4
    split: int | None = None
    num_stages: int = 2


# The dp4a GEMV's types, and the columns its step must cover (one block / super-block at least).
DP4A_STEP = {"Q4_0": 32, "Q5_0": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
# The token-unrolled dp4a GEMV (triton_gemv_tokens): the tokens gguf_matmul sends to it per type, and
# its launch per (type, tokens). From bench/bench_gguf_kernels.py --tokens 1,2,4,8 --sweep --variants
# 'tokens|dp4a|mmq_default|float_kernel' (CUDA-graph timing, H100, 14336x4096 and 4096x14336, session 5),
# microseconds per weight, this kernel / the int8 tensor-core kernel (mmq) that served 2-16 tokens:
#   Q4_0 T=2 20.0-20.3 / 52-54, T=4 27.7 / 52-55, T=8 33.9-39.3 / 54-56 (BN=2, BK=1024 at T > 4);
#   Q4_K T=2 24.6-24.8 / 44-46, T=4 33.7-35.8 / 46-47, T=8 57-59 / 50 (mmq keeps T > 4);
#   Q8_0 T=2 28.8-30.5 / 51, T=4 35.7-36.1 / 51-52, T=8 47-57 / 53 (mmq keeps T > 4);
#   Q6_K T=2 40.4-41.9 / 63-67, T=4 60.7-62.5 / 64-68, T=8 93-124 / 67-70 (mmq keeps T > 4);
#   at T=1 it equals the earlier dp4a GEMV (triton_dp4a.gemv_kernel: one warp, one row, 2048-column steps;
#   17.0-29.9 us) and Q6_K at BN=2, BK=512 takes 31.4-33.3 against 35.0-39.0. That kernel took its tokens
#   as a leading tensor axis and lost to the float tl.dot kernel at T=8 (95-195 against 71-112 us); the
#   MoE route kernel still uses its step functions (gemv_step). Q5_0 and Q5_K (no mmq kernel; the float kernel's 76-105 us at T=8) take it up to
#   8 tokens, by analogy with Q4_0/Q4_K (not yet swept on their own).
# The types whose token-unrolled GEMV reads the activations' block sums (their minimum term).
TOKENS_SUM_TYPES = frozenset({"Q4_K", "Q5_K"})
TOKENS_MAX_TOKENS = {"Q4_0": 8, "Q5_0": 8, "Q8_0": 4, "Q4_K": 4, "Q5_K": 8, "Q6_K": 4}
TOKENS_CONFIG = GemvConfig(bn=1, bk=2048, num_warps=1)
_WIDE = GemvConfig(bn=2, bk=1024, num_warps=1)
TOKENS_CONFIG_BY_TYPE = {                 # type -> ((up to T, config), ...): the first that holds T
    "Q4_0": ((4, TOKENS_CONFIG), (8, _WIDE)), "Q5_0": ((4, TOKENS_CONFIG), (8, _WIDE)),
    "Q4_K": ((1, TOKENS_CONFIG), (8, _WIDE)), "Q5_K": ((1, TOKENS_CONFIG), (8, _WIDE)),
    "Q8_0": ((1, TOKENS_CONFIG), (8, GemvConfig(bn=1, bk=1024, num_warps=1))),
    "Q6_K": ((8, GemvConfig(bn=2, bk=512, num_warps=1)),)}




@dataclass(frozen=True)
class ShapeRule:
    """``config`` for one token and weights of ``rows x cols`` within these bounds (inclusive)."""
    config: GemvConfig
    min_rows: int = 0
    max_rows: int = 1 << 40
    min_cols: int = 0
    max_cols: int = 1 << 40

    def holds(self, rows: int, cols: int) -> bool:
        return self.min_rows <= rows <= self.max_rows and self.min_cols <= cols <= self.max_cols


# One token, by weight shape (the first rule that holds; else the per-type launch above). Session 12 swept 15
# launches at the 1.5B and 8B Llama shapes (``--tokens 1 --sweep --variants '^tokens'``, CUDA-graph timing,
# H100), us, this rule / the launch before:
# - Q4_K at most 4096 columns and at least 2048 rows, two rows per 1024-column step: 2048x2048 3.9 / 4.1,
#   3072x2048 4.4 / 5.2, 4096x4096 7.6 / 8.5, 6144x4096 9.6 / 10.9, 16384x2048 12.1 / 14.5, 28672x4096 32.4 /
#   33.6; not at 1024x4096 (4.8 / 3.8), 512x2048, nor 8192 columns and more (2048x8192 9.6 / 7.7);
# - Q4_0 of at least 8192 rows and at most 2048 columns, two rows per 512-column step: 16384x2048 11.8 / 14.0
#   (the other shapes are within 5% of the default, or slower);
# - Q6_K of at most 2048 rows, one row per 2048-column step (twice the programs): 512x2048 2.9 / 4.3,
#   2048x2048 4.8 / 5.3, 1024x4096 4.9 / 7.4, 2048x8192 11.9 / 15.7; of 14336 columns and more, K cut in
#   four: 4096x14336 30.6 / 34.1. Its wide weights kept two rows per 512-column step (16384x2048 18.9,
#   32000x2048 33.9, 128256x4096 218 us: every other launch of that sweep was slower; 256-column steps, below,
#   were not in it).
# More warps per program lost at every shape (a row's columns spread over warps are summed through shared
# memory): Q4_K 4096x14336 one warp 18.9, two 23.5, four 26.1 us at 2048-column steps.
# Session 16 swept 1, 2, 4 and 8 rows per program at 256-2048-column steps and K cut in 1, 2 and 4 at the 1.5B and
# 8B shapes (``.dev/s16/gemv_exp.py``: the GEMV launch alone and after the activations' quantize launch, CUDA-graph
# timing, H100, device copy 3,016 GB/s), us, this rule / the launch before (after the quantize launch):
# - Q4_K of 14336 columns and more, two rows per 1024-column step, K cut in two: 4096x14336 17.0 / 18.5 (17.7 /
#   19.0); an 8B ffn_down's sums go to the residual add unreduced (``SplitSums``), as Q6_K's already did;
# - Q6_K of 8192 columns and more, two rows per 256-column step, K cut in four: 4096x14336 27.9 / 29.2 (28.5 /
#   30.1), 2048x8192 9.7 / 11.6 (10.3 / 12.2);
# - Q6_K of 8192 rows and more (output heads), two rows per 256-column step: 128256x4096 198 / 217 (197 / 215),
#   32000x2048 30.1 / 33.3 (30.3 / 33.7); Q6_K gate/up weights (28672x4096 in a Q6_K file) take it by analogy,
#   not measured. Four rows per step were within 1% of two.
# The other shapes kept their launch (within 3%, or slower). Loading the next step's weights in registers ahead of
# the step (one or two steps) and Triton's software pipelining of the K loop (``tl.range(num_stages=2-4)``,
# cp.async copies through shared memory) were slower at every shape: up to 1.5x and 1.9x the time.
SHAPE_RULES = {
    "Q4_K": (ShapeRule(GemvConfig(bn=2, bk=1024, num_warps=1, split=2), min_cols=14336),
             ShapeRule(GemvConfig(bn=2, bk=1024, num_warps=1), min_rows=2048, max_cols=4096)),
    "Q4_0": (ShapeRule(GemvConfig(bn=2, bk=512, num_warps=1), min_rows=8192, max_cols=2048),),
    "Q6_K": (ShapeRule(GemvConfig(bn=2, bk=256, num_warps=1, split=4), min_cols=8192),
             ShapeRule(GemvConfig(bn=1, bk=2048, num_warps=1, num_stages=3), max_rows=2048),
             ShapeRule(GemvConfig(bn=2, bk=256, num_warps=1), min_rows=8192)),
}


def tokens_config(name: str, tokens: int, rows: int = 0, cols: int = 0) -> GemvConfig:
    """The token-unrolled GEMV's measured launch for ``tokens`` (1-8) of type ``name`` on a ``rows x cols``
    weight (0: unknown, the per-type launch)."""
    if tokens == 1 and rows and cols:
        rule = next((rule for rule in SHAPE_RULES.get(name, ()) if rule.holds(rows, cols)), None)
        if rule is not None:
            return rule.config
    return next((config for most, config in TOKENS_CONFIG_BY_TYPE.get(name, ()) if tokens <= most), TOKENS_CONFIG)


# The L1 eviction policy of the GEMV's weight loads per type (default otherwise). Each weight byte is read once,
# while every program reads the same activations: weights marked to leave L1 first keep the activations there.
# Session 12 (``bench/bench_gguf_kernels.py --tokens 1``, H100, both policies in one call), us at 28672x4096 /
# 4096x14336 / 4096x4096 / 2048x8192 / 16384x2048: Q4_K 31.1 / 18.2 / 7.5 / 7.7 / 11.9 against 33.3 / 19.8 / 7.9 /
# 8.0 / 12.8 by default; Q6_K 54.4 / 30.2 / 10.7 / 12.4 / 19.4 against 55.9 / 31.4 / 11.2 / 12.4 / 19.7. Q4_0
# (29.3 / 18.3 against 28.1 / 17.6 at the first two) and Q8_0 (31.3 against 29.7 at 4096x14336) lost. In the engine
# (``TOOLKIT_GGUF_EVICT=0`` against the default, with the int8 kernel's below): batch-1 decode 918-922 -> 989-991
# tok/s (1.5B Q4_K_M), 336-337 -> 347 (8B Q4_K_M); batch 8 +1.3% for both.
WEIGHT_EVICTION = {"Q4_K": "evict_first", "Q6_K": "evict_first"}
# The same for the int8 tensor-core kernel's (``triton_mmq``, 2-16 tokens) quant loads. Session 12, same bench
# and call, us at T=8 / 16: Q6_K 28672x4096 126-128 / 146-148 against 136-138 / 162, 4096x14336 66-67 / 76-78
# against 69-70 / 80-81, 2048x8192 22-23 / 26 against 24 / 27; Q4_K within 1% either way (not marked). In the
# 16-bit kernel (``triton_dot16``, 17-64 tokens) the policy lost for Q6_K (4096x14336 T=64: 106-108 against
# 100-101 us) and did nothing for Q4_K, so that kernel keeps the default.
MMQ_EVICTION = {"Q6_K": "evict_first"}
# The int8 tensor-core kernel's (``triton_mmq``) types and the columns of one of their blocks, and the types whose
# minimum term reads the activations' block sums: here, beside the other launch choices, so that choosing a kernel
# does not import (and decorate) the kernels themselves; each family is imported at its first launch.
MMQ_TYPES = {"Q4_0": 32, "Q8_0": 32, "Q4_K": 256, "Q5_K": 256, "Q6_K": 256}
MMQ_MIN_TYPES = frozenset({"Q4_K", "Q5_K"})


def eviction(table: dict[str, str], name: str) -> str:
    """The weight loads' eviction policy of type ``name`` in ``table``; "" (the default policy) for every type
    with ``TOOLKIT_GGUF_EVICT=0`` (read at every call, for A/B timing)."""
    return table.get(name, "") if os.environ.get("TOOLKIT_GGUF_EVICT", "1") != "0" else ""

