"""The engine over a tensor-parallel handle (tp=2, gloo on CPU): scheduler and sampler here, one
model runner per worker; outputs equal the single-process engine's."""
from __future__ import annotations

import torch

import toolkit
from toolkit import LLM, SamplingParams


def test_tp2_engine_matches_tp1(tiny_llama):
    generator = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 500, (n,), generator=generator).tolist() for n in (5, 23, 40)]
    params = [SamplingParams(max_tokens=8, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0.8, seed=3, ignore_eos=True),
              SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, logprobs=1)]
    single = LLM(toolkit.load(tiny_llama.path, device="cpu"), max_num_batched_tokens=32)
    expected = single.generate(prompts, params)
    with LLM(tiny_llama.path, device="cpu", tp=2, max_num_batched_tokens=32) as parallel:
        got = parallel.generate(prompts, params)
        assert parallel.stats()["num_free_blocks"] == parallel.stats()["num_blocks"]
    assert [out.token_ids for out in got] == [out.token_ids for out in expected]
    assert [out.text for out in got] == [out.text for out in expected]


def test_engine_over_workers_lowers_the_callers_threads(tiny_llama):
    """The caller only schedules and samples; its spinning OpenMP threads would starve the workers."""
    from toolkit.core.engine.llm import CALLER_THREADS_WITH_WORKERS  # noqa: PLC0415

    before = torch.get_num_threads()
    torch.set_num_threads(CALLER_THREADS_WITH_WORKERS + 4)
    try:
        with LLM(tiny_llama.path, device="cpu", tp=2, max_num_batched_tokens=32):
            assert torch.get_num_threads() == CALLER_THREADS_WITH_WORKERS
    finally:
        torch.set_num_threads(before)
