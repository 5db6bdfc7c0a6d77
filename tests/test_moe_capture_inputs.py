"""The Triton MoE path fed what the engine's CUDA-graph captures feed it, run by Triton's interpreter on the CPU.

Why: a prefill graph's warm-up (``PrefillGraphs._capture`` -> ``cuda_graphs.record``) runs the model once for
real with every sequence made inert, and a replayed bucket has ``T - N`` spare tokens. The paged-attention
kernel writes no output row for a token of no sequence (its output is ``torch.empty``), so those rows hold
whatever the allocator's block held before; int8 activation buffers (the MoE int8 route blocks' quants, the
dense mmq's) reinterpreted as bf16 are full of NaN and inf bit patterns. A non-finite router logit made the
route kernel (``moe_triton.route_kernel``) name expert ``next_power_of_2(E)`` (>= E): it picked the lowest
expert whose probability equalled the row's maximum, and no NaN equals anything. ``align_routes`` then
indexes its per-expert counts with that id: on the CPU ``scatter_add_`` raises, on CUDA it is a
device-side assert. These tests give the spare rows non-finite values and require that every id names an
expert and that the real rows still equal the torch reference (gguf-py's dequantization).

Also here: the int8 route blocks' dispatch by route count (``MOE_INT8_ROUTES``, ``TOOLKIT_MOE_INT8``).

Skipped where Triton is not installed and on CUDA machines (tests/test_moe_gpu.py captures the compiled
kernels in a CUDA graph there).
"""
from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from triton_interpreter import interpreted_gguf_chain, rerun_in_fresh_process, start_interpreter

INTERPRETED = start_interpreter("test_moe_gpu.py")
here = pytest.mark.skipif(not INTERPRETED, reason="Triton was imported compiled; run in a fresh process")
if INTERPRETED:
    interpreted_gguf_chain()
    moe_triton = importlib.import_module("toolkit.kernels.moe_triton")
    triton_moe = importlib.import_module("toolkit.kernels.gguf_moe.triton_moe")

from toolkit.kernels import moe as moe_reference  # noqa: E402
from toolkit.kernels import gguf_moe as gguf_moe_reference  # noqa: E402

NAN, INF = float("nan"), float("inf")


@pytest.mark.skipif(INTERPRETED, reason="this process runs the tests itself")
def test_in_a_fresh_interpreter_process():
    rerun_in_fresh_process(__file__)


def _garbage_logits(experts: int) -> torch.Tensor:
    """Router logits a spare row can produce: all NaN, one +inf, all -inf, one NaN among finite values."""
    rows = torch.randn(4, experts, generator=torch.Generator().manual_seed(1))
    rows[0] = NAN
    rows[1, experts // 2] = INF
    rows[2] = -INF
    rows[3, 1] = NAN
    return rows


@here
@pytest.mark.parametrize("experts", [8, 6])  # a power of two (the bad id was E itself) and not (it was 8 > E)
@pytest.mark.parametrize("renormalize", [True, False])
def test_route_kernel_names_an_expert_whatever_the_logits(experts, renormalize):
    """Finite rows: the reference's ids and weights. Non-finite rows: ``k`` distinct experts in range (the
    reference's ``torch.topk`` counts NaN as the largest, so its ids are in range too) and NaN weights, as
    the reference gives."""
    top_k = 2
    finite = torch.randn(5, experts, generator=torch.Generator().manual_seed(0)) * 3
    logits = torch.cat([finite, _garbage_logits(experts)])
    weights, ids = moe_triton.moe_route(logits, top_k, renormalize)
    ref_weights, ref_ids = moe_reference.moe_route(logits, top_k, renormalize)
    assert ((ids >= 0) & (ids < experts)).all(), ids
    assert all(len(set(row.tolist())) == top_k for row in ids)
    torch.testing.assert_close(ids[:5], ref_ids[:5], rtol=0, atol=0)
    torch.testing.assert_close(weights[:5], ref_weights[:5], rtol=1e-6, atol=1e-7)
    assert ref_weights[5:].isnan().all() and weights[5:].isnan().all()


def _packed(qtype, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random valid blocks of ``qtype`` (small finite fp16 scale and minimum) as uint8 ``[rows, bytes]``."""
    rng = np.random.default_rng(seed)
    block, nbytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // block, nbytes), dtype=np.uint8)
    offsets = {Q.Q4_K: (0, 2), Q.Q8_0: (0,)}[qtype]
    for offset in offsets:
        blocks[:, offset:offset + 2] = rng.uniform(-0.02, 0.02, (blocks.shape[0], 1)).astype(np.float16).view(np.uint8)
    return torch.from_numpy(blocks.reshape(rows, -1).copy())


@here
@pytest.mark.parametrize("int8", [True, False], ids=["int8-route-blocks", "float-route-blocks"])
def test_fused_moe_with_a_prefill_captures_spare_rows(int8, monkeypatch):
    """A bucket of 8 tokens of which 5 are real: the 3 spare rows' activations and router logits are
    non-finite (what an unwritten attention row gives). The route blocks (the one-route-per-program limit
    lowered to 4 routes so 16 routes take them, as 128+ do on the GPU) must run, and the real rows must
    equal the torch reference on the real tokens alone (int8 rounding of x and of the gated hidden: the
    tolerance of test_moe_gpu.py)."""
    experts, hidden, inter, top_k, real, bucket = 4, 256, 64, 2, 5, 8
    monkeypatch.setattr(moe_triton, "DECODE_ROUTES", 4)
    monkeypatch.setenv("TOOLKIT_MOE_INT8", "1" if int8 else "0")
    gate_up = _packed(Q.Q4_K, experts * 2 * inter, hidden, 10)
    down = _packed(Q.Q8_0, experts * hidden, inter, 11)
    x = torch.randn(bucket, hidden, generator=torch.Generator().manual_seed(12)) * 0.5
    x[real:] = torch.tensor([NAN, INF, -INF])[:, None]
    logits = torch.randn(bucket, experts, generator=torch.Generator().manual_seed(13))
    logits[real:] = _garbage_logits(experts)[:bucket - real]
    weights, ids = moe_triton.moe_route(logits, top_k, True)
    args = (gate_up, int(Q.Q4_K), down, int(Q.Q8_0))
    got = triton_moe.gguf_fused_moe(x, *args, weights, ids)
    ref_weights, ref_ids = moe_reference.moe_route(logits[:real], top_k, True)
    expected = gguf_moe_reference.gguf_fused_moe(x[:real], *args, ref_weights, ref_ids)
    tolerance = (4e-2 if int8 else 1e-4) * expected.abs().max().item()
    torch.testing.assert_close(got[:real], expected, atol=tolerance, rtol=0)


@here
def test_int8_route_blocks_by_route_count(monkeypatch):
    """The dispatch: unset ``TOOLKIT_MOE_INT8`` takes the int8 route blocks for route counts in
    ``MOE_INT8_ROUTES`` (inclusive) only, ``=1`` / ``=0`` force them on / off; whichever kernel runs, the
    result is the torch reference's (int8 or float tolerance). 3 and 6 tokens x top-2 with the
    one-route-per-program limit at 4 routes: 6 and 12 routes in blocks."""
    experts, hidden, inter, top_k = 4, 256, 64, 2
    monkeypatch.setattr(moe_triton, "DECODE_ROUTES", 4)
    monkeypatch.setattr(triton_moe, "MOE_INT8_ROUTES", (8, 12))
    monkeypatch.delenv("TOOLKIT_MOE_INT8", raising=False)
    args = (_packed(Q.Q4_K, experts * 2 * inter, hidden, 20), int(Q.Q4_K), _packed(Q.Q8_0, experts * hidden, inter, 21),
            int(Q.Q8_0))
    calls = []
    real_mmq = triton_moe.mmq_routes
    monkeypatch.setattr(triton_moe, "mmq_routes", lambda *a, **k: calls.append(a[2]) or real_mmq(*a, **k))
    cases = ((6, None, True), (3, None, False), (3, "1", True), (6, "0", False), (6, "open", True), (3, "open", False))
    for tokens, setting, int8 in cases:
        if setting == "open":  # no upper bound: from 8 routes on
            monkeypatch.setattr(triton_moe, "MOE_INT8_ROUTES", (8, None))
            monkeypatch.delenv("TOOLKIT_MOE_INT8", raising=False)
        elif setting is None:
            monkeypatch.delenv("TOOLKIT_MOE_INT8", raising=False)
        else:
            monkeypatch.setenv("TOOLKIT_MOE_INT8", setting)
        x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(tokens)) * 0.5
        weights, ids = moe_reference.moe_route(torch.randn(tokens, experts, generator=torch.Generator().manual_seed(9)),
                                               top_k, True)
        calls.clear()
        got = triton_moe.gguf_fused_moe(x, *args, weights, ids)
        assert calls == ([int(Q.Q4_K), int(Q.Q8_0)] if int8 else []), (tokens, setting)
        expected = gguf_moe_reference.gguf_fused_moe(x, *args, weights, ids)
        tolerance = (4e-2 if int8 else 1e-4) * expected.abs().max().item()
        torch.testing.assert_close(got, expected, atol=tolerance, rtol=0)


@here
def test_one_route_per_program_with_shared_experts():
    """Decode (routes <= ``DECODE_ROUTES``: one route per program): 4 tokens x top-3 over 4 experts, so every
    expert serves several tokens; each route's output must still be its own
    expert's rows times its own token (the torch reference, int8 rounding tolerance)."""
    experts, hidden, inter, top_k, tokens = 4, 256, 64, 3, 4
    gate_up = _packed(Q.Q4_K, experts * 2 * inter, hidden, 30)
    down = _packed(Q.Q8_0, experts * hidden, inter, 31)
    x = torch.randn(tokens, hidden, generator=torch.Generator().manual_seed(32)) * 0.5
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(33))
    weights, ids = moe_triton.moe_route(logits, top_k, False)
    assert len(set(ids.flatten().tolist())) < ids.numel()               # experts shared between tokens
    args = (gate_up, int(Q.Q4_K), down, int(Q.Q8_0))
    got = triton_moe.gguf_fused_moe(x, *args, weights, ids)
    expected = gguf_moe_reference.gguf_fused_moe(x, *args, weights, ids)
    torch.testing.assert_close(got, expected, atol=4e-2 * expected.abs().max().item(), rtol=0)
    swapped = triton_moe.gguf_fused_moe(x, *args, weights, ids.flip(0))   # routes of other tokens: another result
    assert not torch.allclose(swapped, got, atol=4e-2 * expected.abs().max().item())
