"""Triton fused MoE over packed GGUF experts: the grouped matmul of ``toolkit.kernels.moe_triton`` with
the GGUF weight tiles of ``toolkit.kernels.gguf`` (word-wise where the type has them), never
materialising a dequantized expert. Expert ``e``'s rows start at row ``e * N`` of the stacked
``[E * N, row_bytes]`` buffer, exactly as the file stores ``ffn_*_exps``."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..gguf.triton_kernels import _weights_and_x
from ..gguf.triton_ops import WORD_GROUP, _codebook, _matmul_tile_width, _packed_ok, _tile_width, _type_args
from ..gguf.types import type_name
from ..moe_triton import route_block, run_moe, store_routes
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


DECODE = (8, 512, 4)   # BN, BK, warps for one route per program (the GEMV of gguf_matmul's decode config)
GROUPED = (64, 128, 4)  # BN, BK, warps for 16-route blocks (gguf_matmul's small-batch config)


def _grouped_matmul(x, a, data, qtype, cols_in, rows_out, route, block_expert, weights, bm, top_k, routes,
                    num_experts, per_route):
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

    return run_moe(x.contiguous(), topk_weights, topk_ids, experts, inter, matmul, activation)


def _supports(x, gate_up, gate_up_qtype, down, down_qtype, topk_weights, topk_ids, activation="silu"):
    if not (x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and x.dim() == 2 and activation == "silu"):
        return False
    experts, hidden, inter = expert_shapes(x, gate_up, down)
    return (_packed_ok(gate_up, gate_up_qtype, hidden) and _packed_ok(down, down_qtype, inter)
            and gate_up.shape[0] == experts * 2 * inter)


gguf_fused_moe.supports = _supports
OPS = {"gguf_fused_moe": gguf_fused_moe}
