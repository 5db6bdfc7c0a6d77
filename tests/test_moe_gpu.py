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
    from toolkit.kernels.gguf_quant import quantize  # noqa: PLC0415

    experts, hidden, inter, top_k = 8, 512, 256, 4
    g = torch.Generator().manual_seed(3)
    gate_up = quantize((torch.randn(experts * 2 * inter, hidden, generator=g) * 0.05).cuda(), qtype)
    down = quantize((torch.randn(experts * hidden, inter, generator=g) * 0.05).cuda(), qtype)
    x = torch.randn(tokens, hidden, generator=g).to("cuda", torch.bfloat16)
    weights, ids = _routes(tokens, experts, top_k, 4)
    args = (x, gate_up, int(qtype), down, int(qtype), weights, ids)
    assert runtime.resolve("gguf_fused_moe", *args) is not runtime.reference("gguf_fused_moe")
    got = runtime.call("gguf_fused_moe", *args)
    expected = runtime.reference("gguf_fused_moe")(x.float(), *args[1:])
    # Up to 64 routes the kernel rounds x and the gated hidden to int8 blocks of 32 (the dp4a GEMV, as
    # llama.cpp's q8_1): under the Triton interpreter that doubled the error against the float path
    # (Q8_0: 1.9% of max|y| against 0.9%), so those steps get twice the float path's tolerance.
    int8 = tokens * top_k <= 64 and qtype.name in triton_ops.DP4A_STEP
    torch.testing.assert_close(got.float(), expected, atol=(4e-2 if int8 else 2e-2) * expected.abs().max().item(),
                               rtol=0)


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
