"""Host side of the 16-bit tensor-core GGUF kernel (``triton_dot16``): which calls it takes, and its launch.

``gguf_matmul`` sends it Q4_0, Q8_0, Q4_K and Q6_K calls of ``DOT16_MIN_TOKENS`` to ``DOT16_MAX_TOKENS`` tokens,
ahead of the int8 kernels (``TOOLKIT_GGUF_DOT16=0``: none; ``TOOLKIT_GGUF_DOT16_MIN_TOKENS`` moves the lower end,
for timing it against them in a whole engine).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton

from ..launch import launch_numbers, split_k
from ..triton_pdl import launch_options
from ..triton_reduce import finish_splits, split_output
from .types import type_name, type_size

DOT16_TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q6_K")
DOT16_MIN_TOKENS = 17
DOT16_MAX_TOKENS = 64
# From bench/bench_gguf_kernels.py --variants dot16 (DOT16_SWEEP there) on an H100, 8B shapes, 32 and 64 tokens
# (docs/benchmarks.md, run 11): 64 rows per warpgroup MMA, 2 stages of loads in flight (3 and 4 were slower in
# 10 of 12 cells: their activation tiles fill shared memory), K split until about 4 programs per SM. ``group``:
# Q4_0/Q8_0 blocks per K-loop iteration, 0 for each type's ``DOT16_GROUP`` (measured with DOT16_GROUPS there and
# in the engine, docs/benchmarks.md run 13: Q4_0 best at 2 (1.5B Q4_0 batch 32/64 12,064/16,135 tok/s against
# 10,428/15,018 at 1 and 11,622/14,198 at 8), Q8_0 at 1 in every shape).
DOT16_LAUNCH = {"bn": 64, "num_warps": 4, "num_stages": 2, "programs_per_sm": 4, "group": 0}
DOT16_GROUP = {"Q4_0": 2}


@dataclass(frozen=True)
class Dot16Rule:
    """Launch values replacing ``DOT16_LAUNCH``'s for type ``name`` at ``bm`` tokens per program (T rounded up to
    a power of two, 16 to 64), on weights of at least ``min_rows`` rows and ``min_cols`` columns (``gluon_ops``'
    rules also bound the tokens: ``min_tokens``)."""
    name: str
    bm: int
    launch: tuple[tuple[str, int], ...]
    min_cols: int = 0
    min_rows: int = 0
    min_tokens: int = 0

    def holds(self, name: str, rows: int, cols: int, bm: int, tokens: int = 0) -> bool:
        """``tokens``: the call's; a rule with ``min_tokens`` holds only from there (0 where callers do not tell)."""
        return (name == self.name and bm == self.bm and cols >= self.min_cols and rows >= self.min_rows
                and (not self.min_tokens or tokens >= self.min_tokens))


# By type and token tile, the first that holds. Session 17 (H100) swept 5 launches (64 or 128 rows per program, 4
# or 8 warps, 1 or 2 stages; now in ``bench/bench_gguf_kernels.py --variants dot16``) at the 1.5B and 8B Llama
# shapes and 32/64 tokens (CUDA graphs over weight copies beyond L2), then timed the winners in the engine, because
# the sweep's per-kernel gains did not all carry over (the 1.5B Q4_0 file at batch 32 kept its tok/s with 128-row
# programs, though the sweep had its gate/up 16384x2048 at 34.9 against 49.9 us); times are this rule / default:
# - Q4_0 at 33-64 tokens, 128 rows per program over 8 warps: engine, 1.5B Q4_0 batch 64 19,583 / 20,348 tok/s
#   against 18,361 / 18,611 with the default (two runs each), as a rule 17,328 / 17,960 against 17,022 / 16,580 (in
#   a call whose llama.cpp build shared the cores); the sweep at T=64: 16384x2048 41.2 / 51.8 us, 2048x8192 27.5 /
#   30.8, 4096x14336 74.7 / 89.4, 28672x4096 139.0 / 151.6.
# - Q6_K of 8192 columns and more at 33-64 tokens, one stage of loads in flight (the default's two stages of
#   activation tiles limit the programs per SM): 4096x14336 T=64 80.4-81.5 / 97.9-98.6 us in three sweeps; engine,
#   8B Q4_K_M batch 64 with this and the Q4_0 rule against none, 6,657 / 6,714 against 6,332 / 6,421 tok/s.
# - Q4_K weights of at least 4096 rows and 4096 columns (the 8B's) at 17-32 tokens, K split for about 8
#   programs per SM instead of 4: engine, 8B Q4_K_M batch 32 (``TOOLKIT_GGUF_DOT16_LAUNCH=64,4,2,8,0`` against the
#   default) 4,790 against 4,389 / 4,383 tok/s, 2 and 1 programs per SM lost (3,945-3,956 and 3,102); as rules
#   (``TOOLKIT_GGUF_DOT16_RULES`` 1 against 0) b32 4,771 / 4,778 against 4,370 / 4,394, b64 6,623 / 6,596 against
#   6,459 / 6,384. Without the row bound the rule also took the 1.5B Q4_K_M's 2048x8192 ffn_down, and its batch 32
#   lost 2% (13,809 / 13,913 against 14,162 / 14,080); the 1.5B Q4_0 file was flat with 8 programs per SM for all
#   its weights (11,907 against 11,984 / 11,985), so Q4_0 keeps 4. Session 18 took Q6_K out of this rule: its sweep
#   had Q6_K 4096x14336 at T=32 on 8 programs per SM at 64.6 us against 60.4 on 4, and in the engine the 8B's batch
#   32 without the Q6_K part ran 4,833 / 4,820 / 4,830 tok/s against 4,787 / 4,776 / 4,766 with it (three rounds).
# - Q4_K of at least 8192 rows and 4096 columns (the 8B's gate/up, 28672x4096) at 33-64 tokens, K split for about 8
#   programs per SM: session 18's sweep (``.dev``-local, the committed launches plus two new kernel shapes, H100) had
#   28672x4096 T=64 at 93.5 against 102.1 us (dense bf16 89.0); 4096x14336 51.2 / 51.1, 14336x4096 53.0 / 51.8 and
#   16384x2048 33.7 / 33.7 (no gain), 4096x4096 21.4 / 18.8 (a loss), hence both bounds. Engine, 8B Q4_K_M batch 64,
#   this rule (without the column bound, which changes nothing for that file) and a Q6_K one for output heads against
#   neither: 7,220 / 7,223 against 6,958 / 6,955 tok/s; the Q6_K rule was flat in the sweep (128256x4096 686.8 /
#   687.9 us, 32000x2048 106.3 / 106.1) and is not kept, nor is the column-less form: it took the 1.5B Q4_K_M's
#   16384x2048 gate/up, and that file's batch 64 lost 2% (21,910 / 21,892 against 22,339 / 22,250).
DOT16_RULES = (
    Dot16Rule("Q4_0", 64, (("bn", 128), ("num_warps", 8))),
    Dot16Rule("Q6_K", 64, (("num_stages", 1),), min_cols=8192),
    Dot16Rule("Q4_K", 32, (("programs_per_sm", 8),), min_cols=4096, min_rows=4096),
    Dot16Rule("Q4_K", 64, (("programs_per_sm", 8),), min_cols=4096, min_rows=8192),
)


def dot16_launch(name: str = "", rows: int = 0, cols: int = 0, bm: int = 0) -> dict:
    """The launch for type ``name`` at ``bm`` tokens per program on ``rows x cols`` weights: ``DOT16_LAUNCH`` with
    the first ``DOT16_RULES`` entry that holds, or every call's ``TOOLKIT_GGUF_DOT16_LAUNCH="BN,WARPS,STAGES,
    PROGRAMS_PER_SM,GROUP"`` (GROUP 0: each type's ``DOT16_GROUP``). ``TOOLKIT_GGUF_DOT16_RULES``: 0 for none, or
    the indices of the rules to use ("0,2": the first and third; an index alone is written with a trailing comma,
    "1,"). Both are for timing alternatives in a whole engine without editing code; a malformed value is a
    ValueError naming the variable."""
    setting = os.environ.get("TOOLKIT_GGUF_DOT16_LAUNCH")
    if setting:
        return launch_numbers("TOOLKIT_GGUF_DOT16_LAUNCH", setting, tuple(DOT16_LAUNCH))
    rule = next((rule for rule in _rules_in_use() if rule.holds(name, rows, cols, bm)), None)
    return {**DOT16_LAUNCH, **dict(rule.launch)} if rule is not None else DOT16_LAUNCH


def _rules_in_use() -> tuple[Dot16Rule, ...]:
    """``DOT16_RULES`` as ``TOOLKIT_GGUF_DOT16_RULES`` selects them (read at every call)."""
    setting = os.environ.get("TOOLKIT_GGUF_DOT16_RULES", "1").strip()
    if setting == "1":
        return DOT16_RULES
    if setting == "0":
        return ()
    try:
        return tuple(DOT16_RULES[int(index)] for index in setting.split(",") if index.strip())
    except (ValueError, IndexError):
        raise ValueError(f"TOOLKIT_GGUF_DOT16_RULES={setting!r}: 0, 1, or indices of DOT16_RULES "
                         f"(0-{len(DOT16_RULES) - 1}) separated by commas") from None


def dot16_range() -> tuple[int, int]:
    """The token counts the kernel takes: (first, last); (0, -1) when ``TOOLKIT_GGUF_DOT16=0``."""
    if os.environ.get("TOOLKIT_GGUF_DOT16", "1") == "0":
        return 0, -1
    return int(os.environ.get("TOOLKIT_GGUF_DOT16_MIN_TOKENS", DOT16_MIN_TOKENS)), DOT16_MAX_TOKENS


# Types whose 17-64-token calls hand their split-K partial sums on to the next op where the caller takes them
# (``kernels/split_sums``: the residual add with the next norm, the gated activation, the rotary KV store), instead
# of a ``sum_splits`` launch per matmul. Session 25, engine A/B on an H100 (fresh processes, two rounds, tok/s, handed
# on / reduced here): 8B Q4_K_M batch 32 5,743 / 5,746 against 5,445 / 5,434 (+5.6%), batch 64 8,261 / 8,321
# against 7,931 / 7,927; 1.5B Q4_K_M batch 32 15,184 / 15,091 against 14,642 / 14,619, batch 64 25,436 / 23,165
# against 22,625 / 21,695. Q4_0 stays out: the 1.5B Q4_0 file's batch 32 lost 7.5% (14,576 / 14,700 against
# 15,827 / 15,703; session 15 saw 8% with the Triton kernel), batch 64 gained 3% (24,692 / 24,752 against 23,947 /
# 24,063); its graph profile had the Gluon Q4_0 matmuls themselves slower when their partials went on (the step's
# span 1.91 against 1.77 ms). ``TOOLKIT_GGUF_DOT16_UNREDUCED``: "0" for none, or type names, comma-separated.
DOT16_UNREDUCED_TYPES = ("Q4_K", "Q6_K")


def dot16_hands_on(qtype: int) -> bool:
    """Whether a 17-64-token call of ``qtype`` may return split-K partial sums (``DOT16_UNREDUCED_TYPES``)."""
    setting = os.environ.get("TOOLKIT_GGUF_DOT16_UNREDUCED")
    types = DOT16_UNREDUCED_TYPES if setting is None else setting.split(",")
    return type_name(qtype) in types


def dot16_takes(data: torch.Tensor, qtype: int, cols: int, tokens: int) -> bool:
    """Whether the kernel takes this call (data already checked by ``triton_ops._packed_ok``): its types and
    token range (``dot16_range``), ahead of the int8 kernels; below that range, the calls a Gluon kernel takes
    (``gluon_ops.GLUON_RULES`` of 16-token tiles)."""
    first, last = dot16_range()
    name = type_name(qtype)
    if not (tokens <= last and name in DOT16_TYPES and cols % 256 == 0):
        return False
    if name == "Q4_K" and data.stride(0) % 4:  # its scales are read as 32-bit words: rows 4-aligned
        return False
    if tokens >= first:
        return True
    from .gluon_ops import gluon_rule  # noqa: PLC0415 - it imports this module

    return gluon_rule(name, data.shape[0], cols, 16, data.device, tokens) is not None  # fewer: where Gluon serves


def dot16_matmul(x: torch.Tensor, data: torch.Tensor, qtype: int, cols: int, bm: int | None = None,
                 bn: int | None = None, num_warps: int | None = None, num_stages: int | None = None,
                 split: int | None = None, programs_per_sm: int | None = None,
                 group: int | None = None, unreduced: bool = False) -> torch.Tensor:
    """``x [T, cols] @ W.T`` -> ``[T, rows]`` in x's dtype (x contiguous, fp16/bf16); ``bm`` (tokens per program)
    defaults to T rounded up to a power of two, 16 to 64, the other launch arguments to ``dot16_launch`` of the
    type, weight shape and ``bm``; ``group`` (1, 2, 4 or 8): Q4_0/Q8_0 blocks per K-loop iteration (default:
    ``DOT16_GROUP`` of the type, else 1). Without launch arguments, a call ``gluon_ops.GLUON_RULES`` takes goes to
    a Gluon kernel (Q4_K, Q6_K, Q4_0 on an H100/H200). ``unreduced``: split-K partial sums returned as they are
    (``finish_splits``)."""
    tokens, rows = x.shape[0], data.shape[0]
    bm = bm or token_tile(tokens)
    if not any((bn, num_warps, num_stages, split, programs_per_sm, group)):  # the dispatch's call, not a benchmark's
        from .gluon_ops import gluon_matmul, gluon_rule  # noqa: PLC0415 - it imports this module

        rule = gluon_rule(type_name(qtype), rows, cols, bm, x.device, tokens)
        if rule is not None:
            return gluon_matmul(x, data, type_name(qtype), cols, bm, rule, unreduced=unreduced)
    launch = dot16_launch(type_name(qtype), rows, cols, bm)
    bn = bn or launch["bn"]
    grid_nm, split = tiles_and_split(tokens, rows, cols, bm, bn, x.device, programs_per_sm or launch["programs_per_sm"],
                                     split)
    out = split_output(split, tokens, rows, x)
    group = group or launch["group"] or DOT16_GROUP.get(type_name(qtype), 1)
    from .triton_dot16 import dot16_kernel  # noqa: PLC0415 - at its first launch (gemv_launch's MMQ_TYPES says why)
    dot16_kernel[(*grid_nm, split)](
        x, data, out, tokens, rows, cols, cols // split, x.stride(0), data.stride(0), QTYPE=int(qtype),
        TS=type_size(qtype), BM=bm, BN=bn, GROUP=group, num_warps=num_warps or launch["num_warps"],
        num_stages=num_stages or launch["num_stages"], **launch_options(x.device))
    return finish_splits(out, x.dtype, unreduced)


def token_tile(tokens: int) -> int:
    """Tokens per program for ``tokens`` activation rows: their count rounded up to a power of two, 16 to 64."""
    return max(16, min(64, triton.next_power_of_2(tokens)))


def tiles_and_split(tokens: int, rows: int, cols: int, bm: int, bn: int, device: torch.device, programs_per_sm: int,
                    split: int | None = None) -> tuple[tuple[int, int], int]:
    """The grid's row and token tiles, and the K split: ``split`` (default: about ``programs_per_sm`` programs per SM,
    ``launch.split_k``) lowered until each split is whole super-blocks of 256 columns."""
    grid_nm = (triton.cdiv(rows, bn), triton.cdiv(tokens, bm))
    superblocks = cols // 256
    if split is None:
        split = split_k(grid_nm[0] * grid_nm[1], superblocks, device, programs_per_sm)
    while superblocks % split:
        split -= 1
    return grid_nm, split
