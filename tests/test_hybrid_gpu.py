"""On a CUDA device: the Triton recurrent decode kernels against the torch references, and the
engine on a tiny hybrid model, dense and MoE (decode replayed from CUDA graphs, fused-MoE Triton kernel) against one-at-a-time greedy on
CPU (which test_qwen3_hybrid.py checks against transformers). Skipped without CUDA."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams
from toolkit.kernels import runtime

pytestmark = pytest.mark.gpu


def _states(slots, shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(slots, *shape, generator=g).to("cuda", dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv1d_decode_kernel_matches_reference(dtype):
    batch, channels, width = 7, 700, 4
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, channels + 5, generator=g).to("cuda", dtype)[:, :channels]  # strided rows
    weight = torch.randn(channels, width, generator=g).to("cuda", dtype)
    slots = torch.tensor([5, 0, 3, 9, 1, 2, 7], device="cuda")
    fresh = torch.tensor([False, True, False, False, True, False, False], device="cuda")
    state_ref = _states(10, (channels, width - 1), dtype, 1)
    state_tri = state_ref.clone()
    impl = runtime.resolve("causal_conv1d_decode", x, weight, None, state_tri, slots, fresh)
    assert impl is not runtime.reference("causal_conv1d_decode")
    expected = runtime.reference("causal_conv1d_decode")(x, weight, None, state_ref, slots, fresh)
    got = impl(x, weight, None, state_tri, slots, fresh)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)
    torch.testing.assert_close(state_tri, state_ref, atol=0, rtol=0)


@pytest.mark.parametrize("shape", [(2, 4, 8, 12), (16, 32, 128, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gated_delta_rule_decode_kernel_matches_reference(shape, dtype):
    hk, hv, dk, dv = shape
    batch = 5
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(batch, hk, dk, generator=g).to("cuda", dtype) for _ in range(2))
    v = torch.randn(batch, hv, dv, generator=g).to("cuda", dtype)
    decay = (-torch.rand(batch, hv, generator=g)).to("cuda")
    beta = torch.rand(batch, hv, generator=g).to("cuda", dtype)
    slots = torch.tensor([3, 0, 6, 1, 4], device="cuda")
    fresh = torch.tensor([False, False, True, False, False], device="cuda")
    state_ref = _states(8, (hv, dk, dv), torch.float32, 3) * 0.1
    state_tri = state_ref.clone()
    impl = runtime.resolve("gated_delta_rule_decode", q, k, v, decay, beta, state_tri, slots, fresh)
    assert impl is not runtime.reference("gated_delta_rule_decode")
    expected = runtime.reference("gated_delta_rule_decode")(q, k, v, decay, beta, state_ref, slots, fresh)
    got = impl(q, k, v, decay, beta, state_tri, slots, fresh)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), expected.float(), atol=tol, rtol=tol)
    torch.testing.assert_close(state_tri, state_ref, atol=1e-4, rtol=1e-4)


# kind -> environment variable naming a checkpoint made elsewhere (the device's transformers may lack the class)
GPU_KINDS = {"qwen3_5": "HYBRID_GPU_MODEL", "qwen3_5_moe": "HYBRID_MOE_GPU_MODEL"}


@pytest.fixture(scope="module", params=list(GPU_KINDS))
def tiny(request, tmp_path_factory):
    given = os.environ.get(GPU_KINDS[request.param])
    if given:
        return Path(given)
    from hybrid_fixtures import save_hybrid  # noqa: PLC0415

    path = tmp_path_factory.mktemp(request.param)
    save_hybrid(path, request.param, seed=8)
    return path


@pytest.fixture
def no_tf32():
    """fp32 means fp32 (cuDNN's conv1d would otherwise use TF32 and flip near-tied argmaxes)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def _engine_tokens(model, prompts, *, eager: bool, replays: list | None = None):
    with LLM(model, max_num_seqs=8, max_num_batched_tokens=64, kv_cache_memory=64 << 20, max_model_len=256,
             enforce_eager=eager) as llm:
        runner = llm.executor.runner
        assert (runner.graphs is None) == eager
        if replays is not None:  # (decode or prefill, sequences) of every step replayed from a graph
            decode, prefill = runner.graphs.run, runner.prefill_graphs.run
            runner.graphs.run = lambda step: replays.append(("decode", len(step.query_lens))) or decode(step)

            def prefill_replay(step, key):
                logits = prefill(step, key)
                if logits is not None:  # None: the bucket could not be captured and runs eagerly
                    replays.append(("prefill", len(step.query_lens)))
                return logits
            runner.prefill_graphs.run = prefill_replay
        outputs = llm.generate(prompts, SamplingParams(max_tokens=10, temperature=0, ignore_eos=True))
    return [o.token_ids for o in outputs]


def test_engine_decode_from_cuda_graphs_matches_eager_and_cpu_greedy(tiny, no_tf32):
    cpu = toolkit.load(tiny, device="cpu")
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, cpu.config.vocab_size, (n,), generator=gen).tolist() for n in (3, 70, 150, 1, 33)]
    expected = [cpu.generate(p, 10, stop_token_ids=[]) for p in prompts]
    model = toolkit.load(tiny, device="cuda", dtype=torch.float32)  # CUDA defaults to bf16; compare in fp32
    single = [model.generate(p, 10, stop_token_ids=[]) for p in prompts]
    eager = _engine_tokens(model, prompts, eager=True)
    replays: list[tuple[str, int]] = []
    graphs = _engine_tokens(model, prompts, eager=False, replays=replays)
    assert {kind for kind, _ in replays} == {"decode", "prefill"}  # both kinds of step ran from graphs
    assert graphs == eager == single
    assert graphs == expected
