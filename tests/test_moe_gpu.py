"""On a CUDA device: the Triton fused MoE (16-bit and packed GGUF experts) against the torch
references, and an MoE model's decode from CUDA graphs against eager. Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.kernels import runtime

pytestmark = pytest.mark.gpu

GGUF_TYPES = [Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_0]
TOKENS = [1, 3, 40]  # decode (one route per program), small batch, grouped 16-route blocks


def _routes(tokens, experts, top_k, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g).cuda()
    return runtime.call("moe_route", logits, top_k, True)


def _gguf_case(qtype, experts, tokens, top_k, seed, route_seed, hidden=512, inter=256):
    """The ``gguf_fused_moe`` arguments for random experts packed in ``qtype`` (the toolkit quantizer)."""
    from toolkit.kernels.gguf_quant import quantize  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed)
    gate_up = quantize((torch.randn(experts * 2 * inter, hidden, generator=g) * 0.05).cuda(), qtype)
    down = quantize((torch.randn(experts * hidden, inter, generator=g) * 0.05).cuda(), qtype)
    x = torch.randn(tokens, hidden, generator=g).to("cuda", torch.bfloat16)
    weights, ids = _routes(tokens, experts, top_k, route_seed)
    return x, gate_up, int(qtype), down, int(qtype), weights, ids


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_dense_fused_moe_matches_reference(tokens, dtype):
    experts, hidden, inter, top_k = 8, 256, 384, 3
    g = torch.Generator().manual_seed(1)
    gate_up = (torch.randn(experts, 2 * inter, hidden, generator=g) * 0.05).to("cuda", dtype)
    down = (torch.randn(experts, hidden, inter, generator=g) * 0.05).to("cuda", dtype)
    x = torch.randn(tokens, hidden, generator=g).to("cuda", dtype)
    weights, ids = _routes(tokens, experts, top_k, 2)
    assert runtime.resolve("fused_moe", x, gate_up, down, weights, ids) is not runtime.reference("fused_moe")
    got = runtime.call("fused_moe", x, gate_up, down, weights, ids)
    expected = runtime.reference("fused_moe")(x.float(), gate_up.float(), down.float(), weights, ids)
    torch.testing.assert_close(got.float(), expected, atol=2e-2 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda q: q.name)
def test_gguf_fused_moe_matches_reference(qtype, tokens):
    from toolkit.kernels.gguf import triton_ops  # noqa: PLC0415
    hidden, inter, top_k = 512, 256, 4
    args = _gguf_case(qtype, 8, tokens, top_k, 3, 4, hidden, inter)
    x = args[0]
    assert runtime.resolve("gguf_fused_moe", *args) is not runtime.reference("gguf_fused_moe")
    got = runtime.call("gguf_fused_moe", *args)
    expected = runtime.reference("gguf_fused_moe")(x.float(), *args[1:])
    # The kernels round x and the gated hidden to int8 blocks of 32 (as llama.cpp's q8_1): up to 64 routes
    # the dp4a GEMV, above that the int8 tensor-core route blocks. Under the Triton interpreter that
    # doubled the error against the float path (Q8_0: 1.9% of max|y| against 0.9%), so those steps get
    # twice the float path's tolerance.
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415
    if tokens * top_k <= 64:
        int8 = qtype.name in triton_ops.DP4A_STEP
    else:
        routes = tokens * top_k
        int8 = (triton_moe._mmq_routes_ok(int(qtype), hidden, routes)
                and triton_moe._mmq_routes_ok(int(qtype), inter, routes))
    torch.testing.assert_close(got.float(), expected, atol=(4e-2 if int8 else 2e-2) * expected.abs().max().item(),
                               rtol=0)


def _packed_experts(qtype, experts: int, rows: int, cols: int, seed: int):
    """Experts quantized by toolkit's quantizer, stacked ``[E * rows, bytes]`` on CUDA, and gguf-py's
    dequantization of them (float64, ``[E, rows, cols]``): the independent weights of the bounds."""
    from gguf.quants import dequantize  # noqa: PLC0415
    from toolkit.kernels.gguf_quant import quantize  # noqa: PLC0415

    g = torch.Generator().manual_seed(seed)
    packed = quantize((torch.randn(experts * rows, cols, generator=g) * 0.05).cuda(), qtype)
    weight = torch.from_numpy(dequantize(packed.cpu().numpy(), qtype)).double().view(experts, rows, cols)
    return packed, weight.cuda()


def _rounding_bound(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What rounding x to int8 blocks of 32 (|x - d q| <= d / 2, d = max|x_block| / 127) moves x @ W.T,
    per output (1% slack for the float32 scale and reciprocal). ``x [R, K]``, ``weight [R, N, K]``."""
    half_step = x.double().reshape(x.shape[0], -1, 32).abs().amax(2) / 127 / 2                # [R, K / 32]
    per_block = weight.abs().reshape(*weight.shape[:2], -1, 32).sum(3)                      # [R, N, K / 32]
    return 1.01 * torch.einsum("rb,rnb->rn", half_step, per_block)


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda q: q.name)
def test_gguf_moe_int8_route_blocks_within_rounding_bound(qtype):
    """The grouped int8 tensor-core kernel (``mmq_routes``) against float64 products on gguf-py's dequantized
    experts: |y - exact| <= 3u sum|x w| (bf16 output, u = 2**-8) plus the activation-rounding bound, for
    per-token rows (gate_up) and per-route rows times the route weights (down), route blocks of 16, 32 and
    64, several launches, rows off the tile, 2 and 3 super-blocks of columns, and skewed routing (one
    expert with more routes than a block holds; blocks of padding)."""
    from toolkit.kernels import moe_triton  # noqa: PLC0415
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415

    experts, rows, tokens, top_k = 8, 200, 40, 4
    for cols in (512, 768):
        packed, weight = _packed_experts(qtype, experts, rows, cols, cols)
        g = torch.Generator().manual_seed(cols + 1)
        logits = torch.randn(tokens, experts, generator=g)
        logits[:, 0] += 3.0                                            # expert 0 takes most tokens
        weights, ids = runtime.call("moe_route", logits.cuda(), top_k, True)
        routes = tokens * top_k
        w_route = weight[ids.reshape(-1)]                                                   # [routes, rows, cols]
        for per_route in (False, True):
            x = torch.randn(routes if per_route else tokens, cols, generator=g).to("cuda", torch.bfloat16)
            x_route = x.double() if per_route else x.double().repeat_interleave(top_k, 0)
            scale = weights.reshape(-1, 1).double() if per_route else 1.0
            exact = torch.einsum("rnk,rk->rn", w_route, x_route) * scale
            bound = (3 * 2 ** -8 * torch.einsum("rnk,rk->rn", w_route.abs(), x_route.abs())
                     + _rounding_bound(x_route, w_route)) * scale
            for bm, config in ((16, None), (32, (32, 2, 3)), (64, (128, 8, 2)), (16, (16, 1, 1))):
                route, block_expert = moe_triton.align_routes(ids, experts, bm)
                got = triton_moe.mmq_routes(x, packed, int(qtype), cols, rows, route, block_expert,
                                            weights.reshape(-1).float() if per_route else None, bm, top_k, routes,
                                            experts, per_route, config=config)
                assert got.shape == (routes, rows) and got.dtype == torch.bfloat16
                assert ((got.double() - exact).abs() <= bound).all(), (qtype.name, cols, per_route, bm, config)


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda q: q.name)
def test_gguf_fused_moe_int8_and_float_route_blocks(qtype, monkeypatch):
    """The whole op above the one-route-per-program limit takes the int8 route blocks (a spy sees both
    projections) and ``TOOLKIT_MOE_INT8=0`` the float kernel; both match the torch reference."""
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415
    args = _gguf_case(qtype, 16, 64, 4, 7, 8)
    x = args[0]
    expected = runtime.reference("gguf_fused_moe")(x.float(), *args[1:])
    calls = []
    real = triton_moe.mmq_routes
    monkeypatch.setattr(triton_moe, "mmq_routes", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    for int8, tolerance in ((True, 4e-2), (False, 2e-2)):
        monkeypatch.setenv("TOOLKIT_MOE_INT8", "1" if int8 else "0")
        calls.clear()
        got = runtime.call("gguf_fused_moe", *args)
        assert calls == ([int(qtype)] * 2 if int8 else [])
        torch.testing.assert_close(got.float(), expected, atol=tolerance * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("source", ["hf", "gguf-q4_k"])
def test_moe_decode_in_cuda_graphs_equals_eager(source, tmp_path):
    from moe_fixtures import save_moe_model  # noqa: PLC0415
    from toolkit.core.convert import convert  # noqa: PLC0415

    save_moe_model(tmp_path / "hf", "qwen3_moe", mlp_only_layers=[], hidden=256, expert_ffn=256, seed=5)
    path = tmp_path / "hf"
    if source != "hf":
        path = tmp_path / "m.gguf"
        convert(tmp_path / "hf", path, to="gguf:Q4_K")
    loaded = toolkit.load(str(path), device="cuda", dtype="bf16")
    prompts = [[5, 9, 13], [7] * 20, [100, 3], list(range(1, 40))]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    graphs = LLM(loaded, max_num_seqs=8)
    assert graphs.executor.runner.graphs is not None and graphs.executor.runner.graphs.graphs  # captured
    eager = LLM(loaded, max_num_seqs=8, enforce_eager=True)
    assert [o.token_ids for o in graphs.generate(prompts, greedy)] == \
        [o.token_ids for o in eager.generate(prompts, greedy)]
    prefill = graphs.executor.runner.prefill_graphs
    assert prefill.graphs and prefill.note is None  # the prompts' step ran from a captured prefill graph


@pytest.mark.parametrize("tokens, experts, top_k, renormalize, dtype", [
    (1, 128, 8, True, torch.bfloat16), (37, 128, 8, False, torch.bfloat16), (5, 60, 4, True, torch.float32),
    (9, 512, 10, True, torch.float16), (0, 16, 2, True, torch.float32)])
def test_triton_route_matches_reference(tokens, experts, top_k, renormalize, dtype):
    """One-launch routing (softmax, top-k, renormalisation) against the torch reference."""
    from toolkit.kernels import moe, moe_triton  # noqa: PLC0415

    g = torch.Generator().manual_seed(tokens + experts)
    logits = torch.randn(tokens, experts, generator=g).to("cuda", dtype)
    assert runtime.resolve("moe_route", logits, top_k, renormalize) is moe_triton.moe_route
    weights, ids = moe_triton.moe_route(logits, top_k, renormalize)
    expected_weights, expected_ids = moe.moe_route(logits, top_k, renormalize)
    assert ids.dtype == expected_ids.dtype and weights.dtype == expected_weights.dtype
    torch.testing.assert_close(weights, expected_weights, atol=1e-6, rtol=1e-5)
    # 16-bit logits tie often; among equal probabilities torch.topk's order is unspecified (ours: the
    # lowest expert first), so the ids must be distinct experts whose probabilities are the weights
    probs = torch.softmax(logits.float(), dim=-1).gather(1, ids)
    if renormalize:
        probs = probs / probs.sum(-1, keepdim=True)
    torch.testing.assert_close(probs, weights, atol=1e-6, rtol=1e-5)
    assert all(len(set(row)) == top_k for row in ids.tolist())
    ranked = torch.softmax(logits.float(), -1).sort(-1, descending=True).values[:, :top_k + 1]
    untied = (ranked[:, :-1] != ranked[:, 1:]).all(-1)
    assert torch.equal(ids[untied], expected_ids[untied])  # where no probability ties, the same experts


@pytest.mark.parametrize("experts", [128, 60])
def test_triton_route_names_an_expert_for_nonfinite_logits(experts):
    """Compiled: rows with NaN, +inf or all -inf logits get ``k`` distinct experts in ``[0, E)`` and NaN weights
    (the torch reference's weights there are NaN too); the finite rows beside them are the reference's."""
    from toolkit.kernels import moe, moe_triton  # noqa: PLC0415

    logits = torch.randn(7, experts, generator=torch.Generator().manual_seed(experts)) * 3
    logits[3] = float("nan")
    logits[4, 5] = float("inf")
    logits[5] = float("-inf")
    logits[6, 1] = float("nan")
    weights, ids = moe_triton.moe_route(logits.cuda(), 8, True)
    ref_weights, ref_ids = moe.moe_route(logits, 8, True)
    assert ((ids >= 0) & (ids < experts)).all() and all(len(set(row)) == 8 for row in ids.tolist())
    assert weights[3:].isnan().all() and ref_weights[3:].isnan().all()
    torch.testing.assert_close(weights[:3].cpu(), ref_weights[:3], atol=1e-6, rtol=1e-5)
    assert torch.equal(ids[:3].cpu(), ref_ids[:3])


def _poison_allocator() -> None:
    """Leave the caching allocator's free blocks full of 0xFF bytes (NaN in bf16, fp16 and fp32), so a
    ``torch.empty`` that no kernel writes reads NaN, as an unwritten attention row of a prefill graph's
    warm-up or spare token can (int8 activation buffers reused as bf16 are full of NaN and inf patterns).
    Both pools: blocks up to 1 MiB come from 2 MiB segments, larger ones from their own."""
    torch.cuda.synchronize()
    held = [torch.full((size,), 255, dtype=torch.uint8, device="cuda")
            for size in [1 << 20] * 64 + [1 << 16] * 256 + [32 << 20] * 8]
    torch.cuda.synchronize()
    del held


@pytest.mark.parametrize("tokens, real", [(32, 27), (512, 300)])   # route blocks of 16, and of 32 (LARGE_BLOCKS)
@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0], ids=lambda q: q.name)
def test_gguf_moe_int8_in_a_cuda_graph_with_capture_inputs(qtype, tokens, real, monkeypatch):
    """Router + fused MoE with the int8 route blocks (``TOOLKIT_MOE_INT8=1``) captured in a ``torch.cuda.graph``
    as ``PrefillGraphs`` does it: static buffers, a warm-up forward on all-NaN activations (the inert warm-up's
    unwritten rows), capture, then replays with ``real`` real rows and non-finite spare rows. Before the
    route kernel's fix a non-finite row routed to expert E (a device-side assert in ``align_routes``). The
    real rows equal an eager call on the same buffer exactly, and the torch reference on the real rows alone
    (int8 rounding tolerance)."""
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415
    monkeypatch.setenv("TOOLKIT_MOE_INT8", "1")
    experts, top_k, hidden, inter = 16, 4, 512, 256
    x_real, gate_up, gu_type, down, down_type, _, _ = _gguf_case(qtype, experts, real, top_k, 21, 22, hidden, inter)
    router = (torch.randn(experts, hidden, generator=torch.Generator().manual_seed(23)) * 0.05).cuda()
    calls = []
    real_mmq = triton_moe.mmq_routes
    monkeypatch.setattr(triton_moe, "mmq_routes", lambda *a, **k: calls.append(a[2]) or real_mmq(*a, **k))
    x = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16, device="cuda")

    def forward():
        logits = x.float() @ router.T
        weights, ids = runtime.call("moe_route", logits, top_k, True)
        return logits, runtime.call("gguf_fused_moe", x, gate_up, gu_type, down, down_type, weights, ids)

    forward()                                       # the warm-up: every row non-finite
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits, out = forward()
    assert calls and set(calls) == {int(qtype)}     # the int8 route blocks ran, for both projections
    spare = torch.tensor([float("nan"), float("inf"), float("-inf")], device="cuda").repeat(tokens)[:tokens - real]
    x[:real] = x_real
    x[real:] = spare[:, None].to(torch.bfloat16)
    graph.replay()
    torch.cuda.synchronize()
    eager = forward()[1]
    torch.testing.assert_close(out[:real], eager[:real], rtol=0, atol=0)
    weights, ids = runtime.reference("moe_route")(logits[:real], top_k, True)   # the oracle routes the same logits
    expected = runtime.reference("gguf_fused_moe")(x_real.float(), gate_up, gu_type, down, down_type, weights, ids)
    torch.testing.assert_close(out[:real].float(), expected, atol=4e-2 * expected.abs().max().item(), rtol=0)


@pytest.mark.parametrize("int8", [True, False], ids=["int8", "float"])
@pytest.mark.parametrize("to", ["gguf:Q4_K", "gguf:Q8_0"])
def test_moe_engine_graphs_equal_eager_with_int8_route_blocks(to, int8, tmp_path, monkeypatch):
    """The engine with CUDA graphs (decode and prefill, enforce_eager=False) against the eager engine, greedy,
    on a tiny Qwen3-MoE GGUF with packed experts, ``TOOLKIT_MOE_INT8`` on and off, with the allocator's free
    blocks poisoned with NaN before the prompts' step (whose prefill bucket, 64 tokens x top-2, runs the route
    blocks; 63 real tokens): the prefill capture's warm-up must not trip on its unwritten attention rows."""
    from moe_fixtures import save_moe_model  # noqa: PLC0415
    from toolkit.core.convert import convert  # noqa: PLC0415
    from toolkit.kernels.gguf_moe import triton_moe  # noqa: PLC0415

    monkeypatch.setenv("TOOLKIT_MOE_INT8", "1" if int8 else "0")
    save_moe_model(tmp_path / "hf", "qwen3_moe", mlp_only_layers=[], hidden=256, expert_ffn=256, seed=5)
    convert(tmp_path / "hf", tmp_path / "m.gguf", to=to)
    loaded = toolkit.load(str(tmp_path / "m.gguf"), device="cuda", dtype="bf16")
    prompts = [[5, 9, 13], [7] * 20, [100, 3], list(range(1, 39))]   # 63 tokens: bucket 64, one spare token
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    eager = [o.token_ids for o in LLM(loaded, max_num_seqs=8, enforce_eager=True).generate(prompts, greedy)]
    calls = []
    real_mmq = triton_moe.mmq_routes
    monkeypatch.setattr(triton_moe, "mmq_routes", lambda *a, **k: calls.append(a[2]) or real_mmq(*a, **k))
    graphs = LLM(loaded, max_num_seqs=8)
    _poison_allocator()
    got = [o.token_ids for o in graphs.generate(prompts, greedy)]
    prefill = graphs.executor.runner.prefill_graphs
    assert prefill.graphs and prefill.note is None      # the prompts' step ran from a captured prefill graph
    assert bool(calls) == int8                          # the int8 route blocks ran (or did not) in the engine
    assert got == eager
