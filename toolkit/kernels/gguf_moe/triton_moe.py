"""Triton fused MoE over packed GGUF experts: the grouped matmul of ``toolkit.kernels.moe_triton`` with
the GGUF weight tiles of ``toolkit.kernels.gguf`` (word-wise where the type has them), never
materialising a dequantized expert. Expert ``e``'s rows start at row ``e * N`` of the stacked
``[E * N, row_bytes]`` buffer, exactly as the file stores ``ffn_*_exps``.

Kernels, by route count (``moe_triton.block_rows``): up to ``DECODE_ROUTES`` routes one route per
program on int8 activations (``gguf_moe_dp4a_kernel``, the dense decode GEMV's steps); above that,
blocks of ``BM`` routes of one expert on int8 tensor cores (``gguf_moe_mmq_kernel``, the dense mmq
kernel's K loop) for the types that have it, else the float ``tl.dot`` kernel (``gguf_moe_kernel``).
The int8 route blocks run for route counts in ``MOE_INT8_ROUTES`` (16 and up) or always / never with
``TOOLKIT_MOE_INT8=1`` / ``0``. With them on, the engine's first prefill CUDA-graph capture of the
Qwen3-30B-A3B-shaped file once hit a device-side assert (H100). Diagnosed on the CPU
(tests/test_moe_capture_inputs.py), not in this kernel: the capture's warm-up runs on attention rows no
kernel wrote, a non-finite router logit made the route kernel name expert E, and ``align_routes`` indexed
its counts with it (fixed in ``moe_triton.route_kernel``; the int8 path's freed int8 buffers, read as
bf16, only made NaN patterns in those rows likely; tests/test_moe_gpu.py passed on an H100 with the fix).
At 16-4,096 routes it is 1.16-1.37x faster than the float kernel (see ``MOE_INT8_ROUTES``)."""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..gguf.triton_dp4a import STEP_AXES, _axes, gemv_step
from ..gguf.triton_kernels import _weights_and_x
from ..gguf.gemv_launch import MMQ_MIN_TYPES, MMQ_TYPES
from ..gguf.triton_mmq import mmq_tile
from ..gguf.triton_ops import (_HARDWARE_DP4A, DP4A_STEP, WORD_GROUP, _codebook, _dp4a_ok, _matmul_tile_width,
                               _packed_ok, _tile_width, _type_args, activation_blocks, mmq_activations)
from ..gguf.types import type_name, type_size
from ..int8_blocks import Int8Input, handoff_enabled
from ..moe_triton import block_rows, route_block, run_moe, store_routes
from . import expert_shapes


@triton.jit
def gguf_moe_kernel(x_ptr, w_ptr, out_ptr, table_ptr, route_ptr, block_expert_ptr, weight_ptr, num_routes,
                    num_experts, N, row_bytes, stride_x, K: tl.constexpr, TOP_K: tl.constexpr, PER_ROUTE_X: tl.constexpr,
                    MUL_WEIGHT: tl.constexpr, QTYPE: tl.constexpr, TS: tl.constexpr, BLOCK: tl.constexpr,
                    SUB: tl.constexpr, WORDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < num_experts:
        routes, valid, rows = route_block(route_ptr, pid_m, num_routes, BM, TOP_K, PER_ROUTE_X)
        offs_n = pid_n * BN + tl.arange(0, BN)
        row_off = (expert.to(tl.int64) * N + tl.minimum(offs_n, N - 1).to(tl.int64)) * row_bytes
        x_rows = x_ptr + rows[:, None] * stride_x
        x_mask = valid[:, None]
        if BM == 1:
            acc_wide = tl.zeros((BN, BK), dtype=tl.float32)
            for k0 in range(0, K, BK):
                w, x = _weights_and_x(w_ptr, row_off, k0, table_ptr, x_rows, x_mask,
                                      QTYPE, TS, BLOCK, SUB, WORDS, BM, BN, BK)
                acc_wide += tl.reshape(w * x.to(tl.float32), (BN, BK))
            acc = tl.sum(acc_wide, axis=1)[None, :]
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                w, x = _weights_and_x(w_ptr, row_off, k0, table_ptr, x_rows, x_mask,
                                      QTYPE, TS, BLOCK, SUB, WORDS, BM, BN, BK)
                acc = tl.dot(tl.reshape(x, (BM, BK)), tl.trans(tl.reshape(w.to(x.dtype), (BN, BK))), acc)
        store_routes(out_ptr, acc, routes, valid, offs_n, N, weight_ptr, MUL_WEIGHT)


@triton.jit
def gguf_moe_dp4a_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, expert_ptr, weight_ptr, N, row_bytes,
                         K: tl.constexpr, TOP_K: tl.constexpr, PER_ROUTE_X: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                         QTYPE: tl.constexpr, TS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                         AXES: tl.constexpr, DP4A: tl.constexpr):
    """Program (row tile, route): ``out[route, n] = W[expert(route), n] . x_hat[row(route)]`` with the
    dp4a GEMV's step functions (``triton_dp4a``) on int8-rounded activations: ``xq [rows, K / 4]``
    int32 words, ``xd [rows, K / 32]`` scales (``quantize_activations``). ``expert_ptr``: each
    route's expert (the flat top-k ids); the activation row is the route's token for ``gate_up``
    and the route itself for ``down`` (``PER_ROUTE_X``).

    (Session 8 tried routes as the grid's fast axis, so that routes of different tokens to one expert read
    its rows together and share them through L2: batch 8 of the Qwen3-30B-A3B-shaped file stayed at
    851-855 tok/s against 852, H100. The re-reads are not what holds batch 8 back.)"""
    pid_n, route = tl.program_id(0), tl.program_id(1)
    expert = tl.load(expert_ptr + route).to(tl.int64)
    offs_n = pid_n * BN + tl.arange(0, BN)
    row_off = (expert * N + tl.minimum(offs_n, N - 1).to(tl.int64)) * row_bytes
    if PER_ROUTE_X:
        x_row = route
    else:
        x_row = route // TOP_K
    x_row = (x_row + tl.zeros((1,), dtype=tl.int32)).to(tl.int64)          # [1]: the step functions' token axis
    xq_rows = _axes(xq_ptr + x_row * (K // 4), AXES)
    xd_rows = _axes(xd_ptr + x_row * (K // 32), AXES)
    acc = tl.zeros((1, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        acc += gemv_step(w_ptr, row_off, k0, xq_rows, xd_rows, QTYPE, TS, BK, DP4A)
    if MUL_WEIGHT:
        acc *= tl.load(weight_ptr + route)
    tl.store(out_ptr + route.to(tl.int64) * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=(offs_n < N)[None, :])


# One route per program on 8-bit activations, one warp each: BN rows, BK-column steps. An expert's rows are
# short (Qwen3-30B-A3B: gate/up 2,048 columns, down 768), so the dense decode GEMV's one row per program
# (1, 2048, 1; Q6_K 2, 1024, 1) left each program ~1 KB of weights and ran at ~1.6 TB/s at batch 8.
# bench/bench_moe_kernels.py --route-sweep --tokens 1,8 (H100, session 8, gate/up Q4_K, down Q6_K), ms per
# layer at T=1 / T=8: old 0.028 / 0.123; gate/up at 2 rows 0.027 / 0.113; down at 4 rows of 256-column
# steps 0.028 / 0.118 (8 rows or 2 warps: slower). Both in the engine (synthetic Qwen3-30B-A3B Q4_K_M):
# batch 1 306 -> 316, batch 8 853 -> 1,002 tok/s.
DP4A_ROUTE = {"default": (2, 2048, 1), "Q6_K": (4, 256, 1)}   # BN, BK, warps


def _route_launches(setting: str) -> dict:
    """``TOOLKIT_MOE_ROUTE_LAUNCH="default=BN,BK,W;Q6_K=BN,BK,W"`` (read when this module loads): other launches
    for one route per program, to measure them in the engine on a GPU (bench/bench_moe_kernels.py --route-sweep
    times them per layer)."""
    launches = {}
    for item in filter(None, setting.split(";")):
        name, values = item.split("=")
        launches[name.strip()] = tuple(int(v) for v in values.split(","))
    return launches


DP4A_ROUTE.update(_route_launches(os.environ.get("TOOLKIT_MOE_ROUTE_LAUNCH", "")))


def _dp4a_routes(a, data, qtype, cols_in, rows_out, expert_ids, weights, top_k, routes, per_route):
    """One projection of every route (``bm == 1``) with the dp4a GEMV: ``[routes, rows_out]``."""
    name = type_name(qtype)
    bn, bk_wanted, warps = DP4A_ROUTE.get(name, DP4A_ROUTE["default"])
    bk = _tile_width(cols_in, max(bk_wanted, DP4A_STEP[name]))
    blocks = activation_blocks(a, sums=False)
    words, scales = blocks.words, blocks.scales
    out = torch.empty(routes, rows_out, dtype=a.dtype, device=a.device)
    gguf_moe_dp4a_kernel[(triton.cdiv(rows_out, bn), routes)](
        words, scales, data, out, expert_ids, weights if weights is not None else out, rows_out, data.stride(0),
        K=cols_in, TOP_K=top_k, PER_ROUTE_X=per_route, MUL_WEIGHT=weights is not None, QTYPE=int(qtype),
        TS=type_size(qtype), BN=bn, BK=bk, AXES=STEP_AXES[int(qtype)], DP4A=_HARDWARE_DP4A, num_warps=warps)
    return out


@triton.jit
def gguf_moe_mmq_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, route_ptr, block_expert_ptr, weight_ptr, num_routes,
                        num_experts, N, stride_w, K: tl.constexpr, TOP_K: tl.constexpr, PER_ROUTE_X: tl.constexpr,
                        MUL_WEIGHT: tl.constexpr, QTYPE: tl.constexpr, TS: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr):
    """Program (row tile, route block): ``out[route, n] = x_hat[row(route)] . W[expert, n]`` for the
    block's ``BM`` routes (all of one expert, ``align_routes``) on int8 tensor cores (``mmq_tile``),
    times each route's weight when ``MUL_WEIGHT``. ``xq [rows, K]`` int8, ``xd`` / ``xs [rows, K / 32]``
    float32 (``mmq_activations``); the activation row is the route's token for ``gate_up`` and the
    route itself for ``down`` (``PER_ROUTE_X``)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < num_experts:
        routes, valid, rows = route_block(route_ptr, pid_m, num_routes, BM, TOP_K, PER_ROUTE_X)
        offs_n = pid_n * BN + tl.arange(0, BN)
        row = w_ptr + (expert.to(tl.int64) * N + tl.minimum(offs_n, N - 1).to(tl.int64)) * stride_w
        x_rows = xq_ptr + rows[:, None] * K + tl.arange(0, 32)[None, :]          # [BM, 32]
        acc = mmq_tile(x_rows, xd_ptr + rows * (K // 32), xs_ptr + rows * (K // 32), valid, row, 0, K,
                       QTYPE, TS, BM, BN, "", False)
        store_routes(out_ptr, acc, routes, valid, offs_n, N, weight_ptr, MUL_WEIGHT)


# Route blocks on int8 tensor cores: BN rows per program, warps, pipeline stages. Unlike the dense mmq
# launch (BN=32, 2 warps, K split to reach ~8 programs per SM over 2-16 tokens), the grouped launch has
# programs to spare (route blocks x row tiles: ~3,000-9,000 at the Qwen3-30B-A3B shapes from batch 32
# up), so no K split, and BN=64 halves the re-reads of each block's activations against BN=32; 4 warps
# as the float grouped kernel. A first guess, not yet swept on a GPU (bench/bench_moe_kernels.py --sweep).
MMQ_ROUTE = {"default": (64, 4, 3)}


# Route counts (inclusive bounds) whose route blocks take the int8 tensor-core kernel by default; None: none
# do. ``bench/bench_moe_kernels.py --ab --routes 16,64,256,512,1024 --bm 1,16,32`` (H100, session 6, Qwen3-30B-A3B
# shapes, gate_up Q4_K, down Q6_K, after the packed-register unpacking in ``triton_mmq``), ms per layer, int8
# BM=16 against float BM=16: 16 routes 0.105 / 0.145, 64: 0.252 / 0.331, 256: 0.437 / 0.589, 512: 0.494 / 0.659,
# 1,024: 0.520 / 0.664 (1.28-1.37x; BM=32 was slower for both). Up to ``DECODE_ROUTES`` one route per program
# is faster still (64 routes: 0.126). The engine's CUDA-graph tests pass with it on (tests/test_moe_gpu.py -k
# "capture_inputs or int8_route_blocks", same run, after the route kernel's non-finite fix).
# Prefill (session 7, same command with --routes 2048,4096 --bm 16,32 --sweep, H100): 2,048 routes int8 0.698-0.750
# ms per layer against float BM=32 0.897; 4,096 routes int8 BM=32 1.049 against 1.217 (1.16-1.29x). In the engine
# (synthetic Qwen3-30B-A3B Q4_K_M, fresh processes alternating) a 512-token prefill went from 10,100-10,149 to
# 10,999-11,350 tok/s with int8 at every count, so the upper bound is gone (None: no bound).
MOE_INT8_ROUTES: tuple[int, int | None] | None = (16, None)


def moe_int8_enabled(routes: int) -> bool:
    """Whether ``routes`` routes in blocks take the int8 kernel: ``TOOLKIT_MOE_INT8=1`` always, ``=0`` never,
    otherwise (unset) when ``routes`` lies in ``MOE_INT8_ROUTES`` (an upper bound of None: no bound)."""
    setting = os.environ.get("TOOLKIT_MOE_INT8", "")
    if setting in ("0", "1"):
        return setting == "1"
    if MOE_INT8_ROUTES is None:
        return False
    low, high = MOE_INT8_ROUTES
    return low <= routes and (high is None or routes <= high)


def _mmq_routes_ok(qtype: int, cols_in: int, routes: int) -> bool:
    name = type_name(qtype)
    return name in MMQ_TYPES and cols_in % MMQ_TYPES[name] == 0 and moe_int8_enabled(routes)


def mmq_routes(a, data, qtype, cols_in, rows_out, route, block_expert, weights, bm, top_k, routes, num_experts,
               per_route, config=None):
    """One projection of every route block (``bm >= 16``) on int8 tensor cores: ``[routes, rows_out]`` in
    a's dtype. ``a``: the activation rows (tokens, or routes when ``per_route``), quantized here once;
    ``config``: (BN, warps, stages), default ``MMQ_ROUTE``'s."""
    name = type_name(qtype)
    bn, warps, stages = config or MMQ_ROUTE.get(name, MMQ_ROUTE["default"])
    quants, scales, sums = mmq_activations(a, name)
    out = torch.empty(routes, rows_out, dtype=a.dtype, device=a.device)
    gguf_moe_mmq_kernel[(triton.cdiv(rows_out, bn), block_expert.numel())](
        quants, scales, sums, data, out, route, block_expert, weights if weights is not None else scales, routes,
        num_experts, rows_out, data.stride(0), K=cols_in, TOP_K=top_k, PER_ROUTE_X=per_route,
        MUL_WEIGHT=weights is not None, QTYPE=int(qtype), TS=type_size(qtype), BM=bm, BN=bn, num_warps=warps,
        num_stages=stages)
    return out


DECODE = (8, 512, 4)   # BN, BK, warps for one route per program (the GEMV of gguf_matmul's decode config)
GROUPED = (64, 128, 4)  # BN, BK, warps for 16-route blocks (gguf_matmul's small-batch config)


def _int8_route_kernel(data, qtype: int, cols_in: int, bm: int, routes: int):
    """The int8-activation kernel ``_grouped_matmul`` takes for one projection (``_dp4a_routes`` for one route
    per program, ``mmq_routes`` for route blocks), or None (the float kernel)."""
    if bm == 1 and _dp4a_ok(data, qtype, cols_in):   # the dense GEMV's conditions
        return _dp4a_routes
    if bm >= 16 and _mmq_routes_ok(qtype, cols_in, routes):
        return mmq_routes
    return None


def _grouped_matmul(x, a, data, qtype, cols_in, rows_out, route, block_expert, weights, bm, top_k, routes,
                    num_experts, per_route):
    kernel = _int8_route_kernel(data, qtype, cols_in, bm, routes)
    if kernel is _dp4a_routes:
        return _dp4a_routes(a, data, qtype, cols_in, rows_out, block_expert, weights, top_k, routes, per_route)
    if kernel is mmq_routes:
        return mmq_routes(a, data, qtype, cols_in, rows_out, route, block_expert, weights, bm, top_k, routes,
                          num_experts, per_route)
    bn, bk_wanted, warps = DECODE if bm == 1 else GROUPED
    if type_name(qtype) == "Q6_K" and bm == 1:
        warps = 8
    words = type_name(qtype) in WORD_GROUP
    bk = _matmul_tile_width(qtype, cols_in, bk_wanted) if words else _tile_width(cols_in, min(bk_wanted, 256))
    out = torch.empty(routes, rows_out, dtype=x.dtype, device=x.device)
    grid = (triton.cdiv(rows_out, bn), block_expert.numel())
    gguf_moe_kernel[grid](a, data, out, _codebook(x.device), route, block_expert,
                          weights if weights is not None else out, routes, num_experts, rows_out,
                          data.stride(0), a.stride(0), K=cols_in, TOP_K=top_k, PER_ROUTE_X=per_route,
                          MUL_WEIGHT=weights is not None, WORDS=words, BM=bm, BN=bn, BK=bk, num_warps=warps,
                          **_type_args(qtype))
    return out


# From 2,048 routes (prefill) blocks of 32 routes: bench/bench_moe_kernels.py --ab --tokens 64,512 --bm 16,32
# (H100, Qwen3-30B-A3B shapes, Q4_K gate_up, Q6_K down), ms per layer at 4,096 routes: int8 BM=32 1.159,
# float BM=32 1.166, int8 BM=16 1.358, float BM=16 1.403; at 512 routes BM=16 stays (int8 0.567 against
# 0.716 at BM=32, float 0.646).
LARGE_BLOCKS = (2048, 32)


def projection_int8_input(data: torch.Tensor, qtype: int, cols_in: int, routes: int) -> Int8Input | None:
    """What ``_grouped_matmul`` reads for one projection of ``routes`` routes: int8 blocks (with sums for the
    mmq kernel's minimum-term types) where an int8 kernel serves, else None."""
    kernel = _int8_route_kernel(data, qtype, cols_in, block_rows(routes, LARGE_BLOCKS), routes)
    if kernel is None:
        return None
    return Int8Input(sums=kernel is mmq_routes and type_name(qtype) in MMQ_MIN_TYPES)


def gguf_moe_int8_input(gate_up: torch.Tensor, gate_up_qtype: int, hidden: int, routes: int) -> Int8Input | None:
    """What ``gguf_fused_moe`` reads of its input x for ``routes`` routes (``int8_blocks``)."""
    return projection_int8_input(gate_up, gate_up_qtype, hidden, routes)


gguf_moe_int8_input.supports = lambda gate_up, gate_up_qtype, hidden, routes: _packed_ok(gate_up, gate_up_qtype, hidden)


def gguf_fused_moe(x: torch.Tensor, gate_up: torch.Tensor, gate_up_qtype: int, down: torch.Tensor, down_qtype: int,
                   topk_weights: torch.Tensor, topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    experts, hidden, inter = expert_shapes(x, gate_up, down)
    routes = topk_ids.numel()

    def matmul(a, which, cols, route, block_expert, weights, bm, top_k):
        if which == "gate_up":
            return _grouped_matmul(x, a, gate_up, gate_up_qtype, hidden, cols, route, block_expert, weights, bm,
                                   top_k, routes, experts, False)
        return _grouped_matmul(x, a, down, down_qtype, inter, cols, route, block_expert, weights, bm, top_k,
                               routes, experts, True)

    return run_moe(x.contiguous(), topk_weights, topk_ids, experts, inter, matmul, activation, LARGE_BLOCKS,
                   hidden_int8=projection_int8_input(down, down_qtype, inter, routes) if handoff_enabled() else None)


def _supports(x, gate_up, gate_up_qtype, down, down_qtype, topk_weights, topk_ids, activation="silu"):
    if not (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and x.dim() == 2 and activation == "silu"):
        return False
    experts, hidden, inter = expert_shapes(x, gate_up, down)
    return (_packed_ok(gate_up, gate_up_qtype, hidden) and _packed_ok(down, down_qtype, inter)
            and gate_up.shape[0] == experts * 2 * inter)


gguf_fused_moe.supports = _supports
OPS = {"gguf_fused_moe": gguf_fused_moe, "gguf_moe_int8_input": gguf_moe_int8_input}
