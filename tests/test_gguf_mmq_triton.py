"""The int8 tensor-core GGUF kernels (``triton_mmq.mmq_tile``: the dense ``mmq_kernel`` and the grouped MoE
``gguf_moe_mmq_kernel``) run by Triton's interpreter on the CPU, against float64 products of gguf-py's own
dequantization. Tiny shapes: the interpreter runs every program in numpy.

Two checks per type (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K):
- activations that int8 blocks hold exactly (integers -127..127 times a power of two, 127 reached in
  every block): the kernels' result must equal ``W @ x`` up to float32 summation error (the integer dot
  products are exact; only the scale products and the float32 sums round), a bound ~10^5 times tighter
  than what a wrong bit of any weight moves;
- random float32 activations: within the activation-rounding bound (``d / 2`` per element, as the GPU
  tests in test_gguf_kernels.py) plus the same float32 error.

Skipped where Triton is not installed and on CUDA machines (tests/test_moe_gpu.py and
test_gguf_kernels.py check the compiled kernels). The interpreter switch is read when ``@triton.jit``
decorates, so it must be set before Triton is first imported: where this process imported Triton
earlier (a run of several files), one test runs this file in a fresh process instead.
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from triton_interpreter import interpreted_gguf_chain, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_moe_gpu.py")
here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")
if INTERPRETED:
    interpreted_gguf_chain()
    mmq = importlib.import_module("toolkit.kernels.gguf.triton_mmq")
    ops = importlib.import_module("toolkit.kernels.gguf.triton_ops")
    dot16 = importlib.import_module("toolkit.kernels.gguf.dot16_ops")
    moe_triton = importlib.import_module("toolkit.kernels.moe_triton")
    triton_moe = importlib.import_module("toolkit.kernels.gguf_moe.triton_moe")

TYPES = [Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
F32_ERROR = 2 ** -18   # relative to sum |terms| |x|: float32 scale products and sums over a few dozen blocks


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


# Byte offsets of each type's fp16 fields (ggml's block structs): d, and dmin where the type has one.
FP16_D = {Q.Q4_0: 0, Q.Q8_0: 0, Q.Q4_K: 0, Q.Q5_K: 0, Q.Q6_K: 208}
FP16_DMIN = {Q.Q4_K: 2, Q.Q5_K: 2}


def _weights(qtype, rows: int, cols: int, seed: int):
    """Random valid blocks (small finite fp16 scales) as packed uint8 ``[rows, bytes]``, gguf-py's
    dequantization of them (float64), and the magnitude each weight's float32 terms have: ``|d sc q|
    + |dmin m|`` for the types with a minimum (gguf-py's dequantization with dmin, then d, zeroed)."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    for offset in (FP16_D[qtype], FP16_DMIN.get(qtype)):
        if offset is not None:
            scale = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16)
            blocks[:, offset:offset + 2] = scale.view(np.uint8)
    packed = blocks.reshape(rows, -1)

    def deq(data):
        return torch.from_numpy(dequantize(data, qtype).reshape(rows, cols)).double()

    weight = deq(packed)
    magnitude = weight.abs()
    if qtype in FP16_DMIN:
        no_min, no_scale = packed.copy().reshape(-1, nbytes), packed.copy().reshape(-1, nbytes)
        no_min[:, 2:4] = 0
        no_scale[:, 0:2] = 0
        magnitude = deq(no_min.reshape(rows, -1)).abs() + deq(no_scale.reshape(rows, -1)).abs()
    return torch.from_numpy(packed.copy()), weight, magnitude


def _exact_int8(rows: int, cols: int, seed: int) -> torch.Tensor:
    """float32 rows whose int8 blocks of 32 are exact: integers in -127..127 (127 in each block) times 2**e."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols // 32, 32), generator=g)
    q[:, :, 0] = 127 * (1 - 2 * torch.randint(0, 2, (rows, cols // 32), generator=g))
    scale = 2.0 ** torch.randint(-9, -3, (rows, cols // 32, 1), generator=g)
    return (q * scale).reshape(rows, cols).float()


def _rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What rounding x to int8 blocks of 32 (|x - d q| <= d / 2, d = max|x_block| / 127) moves ``x @ W.T``."""
    half_step = x.double().reshape(x.shape[0], -1, 32).abs().amax(2) / 127 / 2
    return 1.01 * half_step @ weight.abs().reshape(weight.shape[0], -1, 32).sum(2).T


def _check(got, exact, magnitude, extra=0.0, what=()):
    assert got.dtype == torch.float32
    bound = F32_ERROR * magnitude + extra
    assert ((got.double() - exact).abs() <= bound).all(), (what, (got.double() - exact).abs().max().item())


@here
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dense_mmq_kernel(qtype):
    """``mmq_matmul`` (the dense kernel calling ``mmq_tile``): 5 tokens, 24 rows (off the tiles), K split 2."""
    rows, cols = 24, 512
    packed, weight, magnitude = _weights(qtype, rows, cols, 1)
    for x, exact_int8 in ((_exact_int8(5, cols, 2), True),
                          (torch.randn(5, cols, generator=torch.Generator().manual_seed(3)), False)):
        for bm in (16, None):    # None: the dispatch's tile (8 tokens for the rows-first types, MMQ_ROWS_FIRST)
            got = ops.mmq_matmul(x, packed, int(qtype), cols, bm=bm, bn=16, num_warps=1, split=2, num_stages=1)
            rounding = 0.0 if exact_int8 else _rounding_bound(x, weight)
            _check(got, x.double() @ weight.T, x.double().abs() @ magnitude.T, rounding, (qtype.name, exact_int8, bm))


@here
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q8_0, Q.Q4_K, Q.Q6_K], ids=lambda q: q.name)
def test_dense_dot16_kernel(qtype):
    """``dot16_matmul`` (weights decoded to 16 bits, ``triton_dot16``): 19 tokens in tiles of 16 (the second
    partial), 24 rows (off the 16-row tiles), K split 2, Q4_0/Q8_0 at 1, 2 and 8 blocks per K step. float16 activations (the interpreter's bfloat16
    ``tl.dot`` is wrong); each weight is rounded to float16 once (2^-11 relative) and the result is float16."""
    rows, cols = 24, 512
    packed, weight, magnitude = _weights(qtype, rows, cols, 11)
    x = torch.randn(19, cols, generator=torch.Generator().manual_seed(12)).half()
    exact = x.double() @ weight.T
    bound = 2 ** -10 * (x.double().abs() @ magnitude.T + exact.abs())
    for group in (None, 1, 8) if qtype in (Q.Q4_0, Q.Q8_0) else (None,):   # Q4_0/Q8_0 blocks per K step
        got = dot16.dot16_matmul(x, packed, int(qtype), cols, bm=16, bn=16, num_warps=4, split=2, num_stages=1,
                                 group=group)
        assert got.dtype == torch.float16
        assert ((got.double() - exact).abs() <= bound).all(), (qtype.name, group, (got.double() - exact).abs().max())


def _routes(tokens: int, experts: int, top_k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])


@here
@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_grouped_moe_mmq_kernel(qtype):
    """``mmq_routes``, both projections' forms: per-token rows (``gate_up``: route r reads token r // k) in
    blocks of 16 routes, and per-route rows times the route weights (``down``) in blocks of 32 and 16.
    3 experts of 40 rows (off the 32-row tile), 7 tokens x top-2 (every block padded)."""
    experts, rows, cols, tokens, top_k = 3, 40, 512, 7, 2
    packed, weight, magnitude = _weights(qtype, experts * rows, cols, 4)
    ids = _routes(tokens, experts, top_k, 5)
    routes = tokens * top_k
    route_weights = torch.rand(routes, generator=torch.Generator().manual_seed(6))
    w_route = weight.view(experts, rows, cols)[ids.reshape(-1)]                        # [routes, rows, cols]
    m_route = magnitude.view(experts, rows, cols)[ids.reshape(-1)]
    random_x = torch.randn(routes, cols, generator=torch.Generator().manual_seed(9))
    for bm, per_route, exact_int8, x in ((16, False, True, _exact_int8(tokens, cols, 7)),
                                         (32, True, True, _exact_int8(routes, cols, 8)), (16, True, False, random_x)):
        route, block_expert = moe_triton.align_routes(ids, experts, bm)
        weights = route_weights if per_route else None
        got = triton_moe.mmq_routes(x, packed, int(qtype), cols, rows, route, block_expert, weights, bm, top_k,
                                    routes, experts, per_route, config=(32, 1, 1))
        x_route = x.double() if per_route else x.double().repeat_interleave(top_k, 0)      # [routes, cols]
        scale = route_weights.double()[:, None] if per_route else 1.0
        exact = torch.einsum("rnk,rk->rn", w_route, x_route) * scale
        terms = torch.einsum("rnk,rk->rn", m_route, x_route.abs()) * scale
        rounding = 0.0
        if not exact_int8:
            rounding = torch.stack([_rounding_bound(x_route[r:r + 1], w_route[r])[0] for r in range(routes)])
            rounding = rounding * scale
        _check(got, exact, terms, rounding, (qtype.name, bm, per_route, exact_int8))


@here
def test_fused_moe_takes_the_int8_route_blocks(monkeypatch):
    """The whole op with route blocks (the one-route-per-program limit lowered to 4 routes to keep the
    interpreter quick): the int8 route blocks run for both projections (a spy records them) and the
    result is the torch reference's (float activations) within what int8 rounding of x and of the gated
    hidden moves it (test_moe_gpu.py's tolerance) with ``TOOLKIT_MOE_INT8=1`` (opt-in); without it
    (the default) or with ``0`` they go to the float kernel."""
    from toolkit.kernels.gguf_moe import gguf_fused_moe as reference  # noqa: PLC0415

    experts, hidden, inter, tokens, top_k = 2, 256, 64, 5, 2
    monkeypatch.setattr(moe_triton, "DECODE_ROUTES", 4)
    gate_up = _weights(Q.Q4_K, experts * 2 * inter, hidden, 10)[0]
    down = _weights(Q.Q8_0, experts * hidden, inter, 11)[0]
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(12)) * 0.5
    ids = _routes(tokens, experts, top_k, 13)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=torch.Generator().manual_seed(14)), -1)
    args = (x, gate_up, int(Q.Q4_K), down, int(Q.Q8_0), weights, ids)
    expected = reference(*args)
    monkeypatch.setenv("TOOLKIT_MOE_INT8", "1")
    calls = []
    real = triton_moe.mmq_routes
    monkeypatch.setattr(triton_moe, "mmq_routes", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    got = triton_moe.gguf_fused_moe(*args)
    assert calls == [int(Q.Q4_K), int(Q.Q8_0)]
    torch.testing.assert_close(got, expected, atol=4e-2 * expected.abs().max().item(), rtol=0)
    monkeypatch.delenv("TOOLKIT_MOE_INT8")
    got = triton_moe.gguf_fused_moe(*args)
    assert calls == [int(Q.Q4_K), int(Q.Q8_0)]                                       # not called again
    torch.testing.assert_close(got, expected, atol=1e-4 * expected.abs().max().item(), rtol=0)
