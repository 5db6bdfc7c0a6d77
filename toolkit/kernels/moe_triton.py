"""Triton fused mixture-of-experts on CUDA: route, group routes by expert, grouped matmul, weighted sum.

Shared by 16-bit weights (``fused_moe``, here) and packed GGUF experts (``gguf_moe``):

1. ``align_routes``: the ``T * k`` routes (token, expert) sorted by expert and padded so every
   block of ``BM`` routes has one expert; all on the GPU with static shapes (no host sync), so
   decode steps can be captured in CUDA graphs. For ``BM == 1`` no sorting is needed.
2. a grouped matmul per projection: program (n-tile, route-block) multiplies its routes'
   activations (gathered rows) by its expert's weight tile: ``gate_up`` ``[M, 2I]``;
3. ``act(gate) * up`` (torch), then ``down`` with each route's weight applied in the kernel;
4. the ``k`` routes of each token summed (a fixed-order reduction: deterministic).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .int8_blocks import Int8Input, gated
from .triton_reduce import sum_middle

# Up to this many routes, one route per program (BM=1, no sorting); ``TOOLKIT_MOE_DECODE_ROUTES``
# overrides it (read when this module loads), to measure the crossover on a GPU. At 256 (so batch 32
# of a top-8 model ran one route per program too) the Qwen3-30B-A3B-shaped Q4_K_M file decoded batch
# 32 at 1,090 tok/s against 2,223 with 64 (H100, session 4): the 16-route blocks win there.
DECODE_ROUTES = int(os.environ.get("TOOLKIT_MOE_DECODE_ROUTES", "64"))
BM_GROUPED = 16


_ROUTE_INDEX: dict[tuple[torch.device, int], torch.Tensor] = {}


def _route_index(routes: int, device: torch.device) -> torch.Tensor:
    """``arange(routes)`` (int32), made once per device and count outside CUDA-graph capture (a graph's
    warm-up runs first, so a decode step's graph launches no arange; one made during a capture is
    filled only when the graph replays, so it is never kept)."""
    key = (device, routes)
    index = _ROUTE_INDEX.get(key)
    if index is None:
        index = torch.arange(routes, device=device, dtype=torch.int32)
        if not (index.is_cuda and torch.cuda.is_current_stream_capturing()):
            _ROUTE_INDEX[key] = index
    return index


def align_routes(topk_ids: torch.Tensor, num_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(route per slot [P], expert per block [P / bm]); padding slots hold M, empty blocks expert E."""
    flat = topk_ids.reshape(-1).long()
    routes = flat.numel()
    if bm == 1:  # no sorting: route r is slot r, and its expert id is read as it is (int64)
        return _route_index(routes, flat.device), flat
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + bm - 1) // bm * bm
    padded_end = padded.cumsum(0)
    order = torch.argsort(flat, stable=True)
    by_expert = flat[order]
    rank = torch.arange(routes, device=flat.device) - (counts.cumsum(0) - counts)[by_expert]
    slots = triton.cdiv(routes + num_experts * (bm - 1), bm) * bm
    sorted_route = torch.full((slots,), routes, dtype=torch.int32, device=flat.device)
    sorted_route[(padded_end - padded)[by_expert] + rank] = order.to(torch.int32)
    block_start = torch.arange(0, slots, bm, device=flat.device)
    block_expert = torch.searchsorted(padded_end, block_start, right=True).to(torch.int32)
    return sorted_route, block_expert


@triton.jit
def route_block(route_ptr, pid_m, num_routes, BM: tl.constexpr, TOP_K: tl.constexpr, PER_ROUTE_X: tl.constexpr):
    """Block ``pid_m``'s ``BM`` routes, which are real (padding slots hold ``num_routes``), and the
    activation row each reads (int64; its token for ``gate_up``, the route itself for ``down``)."""
    routes = tl.load(route_ptr + pid_m * BM + tl.arange(0, BM))
    valid = routes < num_routes
    if PER_ROUTE_X:
        rows = routes
    else:
        rows = routes // TOP_K
    return routes, valid, tl.where(valid, rows, 0).to(tl.int64)


@triton.jit
def store_routes(out_ptr, acc, routes, valid, offs_n, N, weight_ptr, MUL_WEIGHT: tl.constexpr):
    """``out[route, n] = acc`` for the real routes, times each route's weight when ``MUL_WEIGHT``."""
    if MUL_WEIGHT:
        acc *= tl.load(weight_ptr + routes, mask=valid, other=0.0)[:, None]
    out = out_ptr + routes.to(tl.int64)[:, None] * N + offs_n[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & (offs_n < N)[None, :])


@triton.jit
def dense_moe_kernel(x_ptr, w_ptr, out_ptr, route_ptr, block_expert_ptr, weight_ptr, num_routes, num_experts,
                     N, stride_x, K: tl.constexpr, TOP_K: tl.constexpr, PER_ROUTE_X: tl.constexpr, MUL_WEIGHT: tl.constexpr,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, IEEE: tl.constexpr):
    """out[route, n] = x[row(route)] . W[expert, n] (x W^T per route); W is [E, N, K] contiguous.
    ``IEEE``: float32 operands multiply in full float32 (tl.dot would otherwise round them to TF32)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < num_experts:
        routes, valid, rows = route_block(route_ptr, pid_m, num_routes, BM, TOP_K, PER_ROUTE_X)
        offs_n = pid_n * BN + tl.arange(0, BN)
        w_rows = w_ptr + (expert.to(tl.int64) * N + tl.minimum(offs_n, N - 1).to(tl.int64)) * K
        x_rows = x_ptr + rows * stride_x
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            offs_k = k0 + tl.arange(0, BK)
            x = tl.load(x_rows[:, None] + offs_k[None, :], mask=valid[:, None] & (offs_k < K)[None, :], other=0.0)
            w = tl.load(w_rows[:, None] + offs_k[None, :], mask=(offs_k < K)[None, :], other=0.0)
            if BM == 1:
                acc += tl.sum(w.to(tl.float32) * x.to(tl.float32), axis=1)[None, :]
            elif IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        store_routes(out_ptr, acc, routes, valid, offs_n, N, weight_ptr, MUL_WEIGHT)


def block_rows(routes: int, large: tuple[int, int] | None = None) -> int:
    """Routes per program: 1 up to ``DECODE_ROUTES``, else ``BM_GROUPED``, or ``large = (routes, bm)``'s
    bm from that many routes on (a kernel that measured better with taller blocks in prefill)."""
    if routes <= DECODE_ROUTES:
        return 1
    return large[1] if large is not None and routes >= large[0] else BM_GROUPED


def run_moe(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, inter: int,
            matmul, activation: str, large_blocks: tuple[int, int] | None = None,
            hidden_int8: Int8Input | None = None) -> torch.Tensor:
    """The four steps, with ``matmul(a, which, out_cols, route, block_expert, weights, bm)`` doing one
    grouped projection (``which``: "gate_up" with per-token rows, "down" with per-route rows);
    ``large_blocks``: see ``block_rows``; ``hidden_int8``: the int8 blocks ``down`` reads, written by the
    gated activation's kernel (``int8_blocks``)."""
    tokens, top_k = topk_ids.shape
    bm = block_rows(tokens * top_k, large_blocks)
    route, block_expert = align_routes(topk_ids, num_experts, bm)
    gate_up = matmul(x, "gate_up", 2 * inter, route, block_expert, None, bm, top_k)
    hidden = gated(gate_up, activation, hidden_int8)   # one fused kernel on CUDA
    weights = topk_weights.reshape(-1).float().contiguous()
    down = matmul(hidden.contiguous(), "down", x.shape[-1], route, block_expert, weights, bm, top_k)
    return sum_middle(down.view(tokens, top_k, -1), x.dtype)              # float32, routes in order


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, activation: str = "silu") -> torch.Tensor:
    num_experts, two_inter, hidden = gate_up.shape

    def matmul(a, which, cols, route, block_expert, weights, bm, top_k):
        w = gate_up if which == "gate_up" else down
        routes = topk_ids.numel()
        out = torch.empty(routes, cols, dtype=x.dtype, device=x.device)
        bn, bk = (32, 128) if bm == 1 else (64, 64)
        grid = (triton.cdiv(cols, bn), block_expert.numel())
        dense_moe_kernel[grid](a, w, out, route, block_expert, weights if weights is not None else out, routes,
                               num_experts, cols, a.stride(0), K=w.shape[2], TOP_K=top_k, PER_ROUTE_X=which == "down",
                               MUL_WEIGHT=weights is not None, BM=bm, BN=bn, BK=bk, IEEE=x.dtype == torch.float32)
        return out

    return run_moe(x, topk_weights, topk_ids, num_experts, two_inter // 2, matmul, activation)


fused_moe.supports = lambda x, gate_up, down, topk_weights, topk_ids, activation="silu": (
    # float32 too: a float32 model on CUDA must not fall back to the reference, whose host-side
    # expert counts cannot be captured in a CUDA graph
    x.is_cuda and x.dtype in (torch.float16, torch.bfloat16, torch.float32) and gate_up.dtype == x.dtype
    and down.dtype == x.dtype and gate_up.is_contiguous() and down.is_contiguous() and activation == "silu"
    and x.dim() == 2 and x.is_contiguous())

@triton.jit
def route_kernel(logits_ptr, weights_ptr, ids_ptr, num_experts, stride_t, TOP_K: tl.constexpr,
                 K_PAD: tl.constexpr, RENORMALIZE: tl.constexpr, BE: tl.constexpr):
    """Program t: softmax of token t's router logits in float32, its top ``TOP_K`` (largest first,
    the lowest expert among equal probabilities), optionally renormalised to sum to 1.

    Every id names an expert whatever the logits: a non-finite logit makes the row's probabilities NaN,
    and NaN counts as the largest (as ``torch.topk`` counts it), its weight staying NaN. Rows of
    arbitrary values reach the router for real: a prefill graph's warm-up and its spare tokens carry
    attention rows no kernel wrote (``prefill_graphs``); an id >= E there was an out-of-range index in
    ``align_routes`` (a device-side assert) or an out-of-bounds expert in the route kernels."""
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BE)
    ok = e < num_experts
    logits = tl.load(logits_ptr + t * stride_t + e, mask=ok, other=float("-inf")).to(tl.float32)
    p = tl.exp(logits - tl.max(logits, axis=0))
    probs = tl.where(ok, p / tl.sum(p, axis=0), -1.0)
    rank = tl.where(probs != probs, 2.0, probs)   # the selection key: NaN above every probability, never NaN
    k = tl.arange(0, K_PAD)
    top_w = tl.zeros((K_PAD,), dtype=tl.float32)
    top_id = tl.zeros((K_PAD,), dtype=tl.int64)
    for i in tl.static_range(TOP_K):
        pick = tl.min(tl.where(rank == tl.max(rank, axis=0), e, BE), axis=0)   # < num_experts: TOP_K <= E
        top_w = tl.where(k == i, tl.sum(tl.where(e == pick, probs, 0.0), axis=0), top_w)   # its probability
        top_id = tl.where(k == i, pick.to(tl.int64), top_id)
        rank = tl.where(e == pick, -1.0, rank)
    if RENORMALIZE:
        top_w = top_w / tl.sum(top_w, axis=0)
    tl.store(weights_ptr + t * TOP_K + k, top_w, mask=k < TOP_K)
    tl.store(ids_ptr + t * TOP_K + k, top_id, mask=k < TOP_K)


def moe_route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference's contract in one launch (the reference takes ~6: softmax, top-k's two, sum, divide)."""
    tokens, num_experts = router_logits.shape
    weights = torch.empty(tokens, top_k, dtype=torch.float32, device=router_logits.device)
    ids = torch.empty(tokens, top_k, dtype=torch.int64, device=router_logits.device)
    if tokens:
        route_kernel[(tokens,)](router_logits, weights, ids, num_experts, router_logits.stride(0), TOP_K=top_k,
                                K_PAD=triton.next_power_of_2(top_k), RENORMALIZE=renormalize,
                                BE=triton.next_power_of_2(num_experts), num_warps=1 if num_experts <= 256 else 4)
    return weights, ids


moe_route.supports = lambda router_logits, top_k, renormalize: (
    router_logits.is_cuda and router_logits.dim() == 2 and router_logits.stride(-1) == 1
    and 0 < top_k <= router_logits.shape[1] <= 4096
    and router_logits.dtype in (torch.float16, torch.bfloat16, torch.float32))

OPS = {"fused_moe": fused_moe, "moe_route": moe_route}
