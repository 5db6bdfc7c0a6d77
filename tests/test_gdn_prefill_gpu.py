"""On a CUDA device: the Gated DeltaNet prefill Triton kernels (causal conv1d over prompts, chunked
gated delta rule) against the torch references, which test_recurrent_kernels.py checks against
transformers. Varlen batches with lengths that are not multiples of 64, non-zero initial states,
fresh and resuming slots, fp32 and bf16. The engine test in test_hybrid_gpu.py runs them inside a
model (prompts of 70 and 150 tokens, chunked prefill of 64-token steps). Skipped without CUDA."""
from __future__ import annotations

import pytest
import torch

from toolkit.kernels import runtime

pytestmark = pytest.mark.gpu

LENGTHS = [300, 1, 64, 2, 129, 0, 77]


def _bounds(lengths):
    return torch.tensor([0, *lengths], device="cuda").cumsum(0).to(torch.int32)


def _slots(n):
    slots = torch.randperm(n + 3, generator=torch.Generator().manual_seed(n))[:n].to("cuda")
    fresh = (torch.arange(n) % 3 == 1).to("cuda")
    return slots, fresh


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths", [LENGTHS, [1000]])
def test_conv1d_prefill_kernel_matches_reference(dtype, lengths):
    channels, width = 2 * 16 * 128 + 32 * 128 + 40, 4  # Qwen3.5-9B's conv channels, plus an odd tail
    g = torch.Generator().manual_seed(0)
    x = torch.randn(sum(lengths), channels + 64, generator=g).to("cuda", dtype)[:, :channels]  # strided rows
    weight = torch.randn(channels, width, generator=g).to("cuda", dtype)
    slots, fresh = _slots(len(lengths))
    state_ref = torch.randn(len(lengths) + 3, channels, width - 1, generator=g).to("cuda", dtype)
    state_ref[slots[fresh]] = float("nan")  # fresh slots' old content is never read
    state_tri = state_ref.clone()
    args = (_bounds(lengths), slots, fresh)
    impl = runtime.resolve("causal_conv1d_prefill", x, weight, None, state_tri, *args)
    assert impl is not runtime.reference("causal_conv1d_prefill")
    expected = runtime.reference("causal_conv1d_prefill")(x, weight, None, state_ref, *args)
    got = impl(x, weight, None, state_tri, *args)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(state_tri, state_ref, atol=0, rtol=0)


def _gdr_inputs(lengths, hk, hv, dk, dv, dtype, seed):
    tokens = sum(lengths)
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(tokens, hk, dk, generator=g).to("cuda", dtype) for _ in range(2))
    v = torch.randn(tokens, hv, dv, generator=g).to("cuda", dtype)
    decay = (-torch.rand(tokens, hv, generator=g) * 0.5).to("cuda")  # float32, as the layer computes it
    beta = torch.rand(tokens, hv, generator=g).to("cuda", dtype)
    return q, k, v, decay, beta


@pytest.mark.parametrize("shape", [(16, 32, 128, 128), (2, 4, 64, 48)])  # Qwen3.5-9B; padded v
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunked_gated_delta_rule_kernel_matches_reference(shape, dtype):
    hk, hv, dk, dv = shape
    q, k, v, decay, beta = _gdr_inputs(LENGTHS, hk, hv, dk, dv, dtype, seed=1)
    slots, fresh = _slots(len(LENGTHS))
    g = torch.Generator().manual_seed(2)
    state_ref = (torch.randn(len(LENGTHS) + 3, hv, dk, dv, generator=g) * 0.2).to("cuda")
    state_ref[slots[fresh]] = float("nan")  # fresh slots' old content is never read
    state_tri = state_ref.clone()
    args = (_bounds(LENGTHS), slots, fresh, 64)
    impl = runtime.resolve("gated_delta_rule_prefill", q, k, v, decay, beta, state_tri, *args)
    assert impl is not runtime.reference("gated_delta_rule_prefill")
    expected = runtime.reference("gated_delta_rule_prefill")(q, k, v, decay, beta, state_ref, *args)
    got = impl(q, k, v, decay, beta, state_tri, *args)
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(state_tri, state_ref, atol=tol, rtol=tol)


def test_chunked_gated_delta_rule_kernel_resumes_across_calls():
    """A 1000-token prompt prefilled as 300 + 1 + 699 tokens (each call resuming from the slot the
    previous one wrote, like the engine's chunked prefill) equals the reference over the whole prompt."""
    q, k, v, decay, beta = _gdr_inputs([1000], 16, 32, 128, 128, torch.float32, seed=4)
    state_ref = torch.zeros(2, 32, 128, 128, device="cuda")
    expected = runtime.reference("gated_delta_rule_prefill")(q, k, v, decay, beta, state_ref, _bounds([1000]),
                                                             torch.tensor([1], device="cuda"),
                                                             torch.tensor([True], device="cuda"), 64)
    state = torch.full_like(state_ref, 5.0)
    impl = runtime.resolve("gated_delta_rule_prefill", q, k, v, decay, beta, state, _bounds([1000]), None, None, 64)
    outs = []
    for begin, end in ((0, 300), (300, 301), (301, 1000)):
        part = (t[begin:end] for t in (q, k, v, decay, beta))
        outs.append(impl(*part, state, _bounds([end - begin]), torch.tensor([1], device="cuda"),
                         torch.tensor([begin == 0], device="cuda"), 64))
    torch.testing.assert_close(torch.cat(outs), expected, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(state[1], state_ref[1], atol=2e-4, rtol=2e-4)
