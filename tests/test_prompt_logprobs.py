"""Prompt log-probabilities from the engine (``SamplingParams.prompt_logprobs``), checked against
transformers' own forward on the same random Llama: whole prompts, chunked prefill beside
other requests, prompts whose prefix is already in the prefix cache, and a preempted request."""
from __future__ import annotations

import pytest
import torch

import toolkit
from toolkit import LLM, SamplingParams

VOCAB = 500  # below the fixture's vocab size


def random_prompt(length: int, seed: int) -> list[int]:
    return torch.randint(3, VOCAB, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@torch.no_grad()
def hf_prompt_logprobs(reference, prompt: list[int]) -> list[float]:
    """log p(prompt[i] | prompt[:i]) for i >= 1, from transformers' forward (the independent oracle)."""
    logprobs = reference(torch.tensor([prompt])).logits[0].float().log_softmax(-1)
    return [logprobs[i - 1, prompt[i]].item() for i in range(1, len(prompt))]


@torch.no_grad()
def hf_top_ids(reference, prompt: list[int], n: int) -> list[set[int]]:
    logits = reference(torch.tensor([prompt])).logits[0]
    return [set(logits[i - 1].topk(n).indices.tolist()) for i in range(1, len(prompt))]


@pytest.fixture(scope="module")
def loaded(tiny_llama):
    return toolkit.load(tiny_llama.path, device="cpu")


def scored(out, prompt: list[int]) -> list[float]:
    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    return [entry[token] for entry, token in zip(out.prompt_logprobs[1:], prompt[1:])]


def test_prompt_logprobs_match_transformers_with_chunked_prefill(loaded, tiny_llama):
    llm = LLM(loaded, max_num_seqs=4, max_num_batched_tokens=16)  # 40-token prompts prefill in 3 chunks
    prompts = [random_prompt(40, seed) for seed in (1, 2)] + [random_prompt(7, 3)]
    params = SamplingParams(max_tokens=3, temperature=0, prompt_logprobs=2)
    outs = llm.generate(prompts, [params, SamplingParams(max_tokens=3, temperature=0), params])
    for out, prompt in zip((outs[0], outs[2]), (prompts[0], prompts[2])):
        assert scored(out, prompt) == pytest.approx(hf_prompt_logprobs(tiny_llama.reference, prompt), abs=1e-4)
        for entry, top in zip(out.prompt_logprobs[1:], hf_top_ids(tiny_llama.reference, prompt, 2)):
            assert top <= set(entry) and len(entry) <= 3  # the two most likely, plus the prompt token
    assert outs[1].prompt_logprobs is None
    assert llm.stats()["num_free_blocks"] == llm.stats()["num_blocks"]


def test_prompt_logprobs_skip_the_prefix_cache(loaded, tiny_llama):
    llm = LLM(loaded, max_num_seqs=4, max_num_batched_tokens=64)
    prompt = random_prompt(48, 4)
    llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0))  # its blocks are now cached
    out = llm.generate([prompt], SamplingParams(max_tokens=2, temperature=0, prompt_logprobs=0))[0]
    assert out.num_cached_tokens == 0
    assert scored(out, prompt) == pytest.approx(hf_prompt_logprobs(tiny_llama.reference, prompt), abs=1e-4)


def test_prompt_logprobs_survive_preemption(loaded, tiny_llama):
    # 3 blocks of 16 tokens (8 KiB each: 2 layers x K,V x 2 heads x 16 dims x fp32): both requests
    # start in one block each, and the younger is preempted when both need a second
    llm = LLM(loaded, max_num_seqs=4, max_num_batched_tokens=64, kv_cache_memory=3 * 8192)
    prompts = [random_prompt(10, 5), random_prompt(10, 6)]
    params = SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, prompt_logprobs=0)
    outs = llm.generate(prompts, params)
    assert llm.scheduler.num_preemptions > 0
    for out, prompt in zip(outs, prompts):
        assert scored(out, prompt) == pytest.approx(hf_prompt_logprobs(tiny_llama.reference, prompt), abs=1e-4)
