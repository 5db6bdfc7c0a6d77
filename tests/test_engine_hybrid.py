"""The batching engine on a hybrid (Gated DeltaNet + attention) model: state slots, sizing, preemption.

Expected tokens come from ``LoadedModel.generate`` (one sequence at a time), which
test_qwen3_hybrid.py checks against transformers' greedy generation.
"""
from __future__ import annotations

import random

import pytest
from hybrid_fixtures import KINDS, VOCAB, prompt, save_hybrid

import toolkit
from toolkit import LLM, SamplingParams

FP32 = 4


@pytest.fixture(scope="module", params=list(KINDS))
def loaded(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    hf = save_hybrid(path, request.param, seed=5)
    return toolkit.load(path, device="cpu"), hf.config


def expected_sizes(config) -> tuple[int, int]:
    """(KV bytes per token, state bytes per slot) computed from the HF config alone (fp32)."""
    types = config.layer_types
    per_token = types.count("full_attention") * 2 * config.num_key_value_heads * config.head_dim * FP32
    conv_channels = 2 * config.linear_num_key_heads * config.linear_key_head_dim \
        + config.linear_num_value_heads * config.linear_value_head_dim
    conv = conv_channels * (config.linear_conv_kernel_dim - 1) * FP32
    ssm = config.linear_num_value_heads * config.linear_key_head_dim * config.linear_value_head_dim * FP32
    return per_token, types.count("linear_attention") * (conv + ssm)


def test_memory_report_sizes_kv_by_attention_layers_only(loaded):
    model, config = loaded
    per_token, per_slot = expected_sizes(config)
    budget = 1 << 20
    with LLM(model, max_num_seqs=8, kv_cache_memory=budget, max_model_len=256) as llm:
        report = llm.memory_report()
    assert report["state_slots"] == 8
    assert report["state_bytes"] == 9 * per_slot  # 8 slots + the null slot
    assert report["kv_cache_bytes"] == report["kv_tokens"] * per_token
    assert report["kv_cache_bytes"] + report["state_bytes"] <= budget
    # all of the budget the state pool leaves, in whole blocks (capped by what 8 full sequences can use)
    blocks = min((budget - 9 * per_slot) // (16 * per_token), 8 * 16 + 1)
    assert report["kv_tokens"] == blocks * 16
    assert report["prefix_caching"] is False


def test_batch_with_chunked_prefill_and_forced_preemption_matches_one_at_a_time(loaded):
    model, config = loaded
    per_token, per_slot = expected_sizes(config)
    lengths, new_tokens = [5, 40, 100, 70, 23, 1], 12
    prompts = [prompt(n, seed=10 + i).tolist() for i, n in enumerate(lengths)]
    expected = [model.generate(p, new_tokens, stop_token_ids=[]) for p in prompts]
    budget = 5 * per_slot + 9 * 16 * per_token  # 4 slots + null, 9 blocks: far less than the batch needs
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    with LLM(model, max_num_seqs=4, max_num_batched_tokens=32, kv_cache_memory=budget, max_model_len=128) as llm:
        assert llm.memory_report()["state_slots"] == 4
        outputs = llm.generate(prompts, params)
        stats = llm.stats()
    assert [out.token_ids for out in outputs] == expected
    assert stats["num_preemptions"] > 0


def test_many_random_requests_leave_no_slot_or_block_in_use(loaded):
    model, _ = loaded
    rng = random.Random(0)
    with LLM(model, max_num_seqs=16, max_num_batched_tokens=64, kv_cache_memory=1 << 20, max_model_len=128) as llm:
        pool, blocks = llm.state_pool, llm.block_manager
        ids = [llm.add_request([rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))],
                               SamplingParams(max_tokens=rng.randint(1, 4), temperature=0, ignore_eos=True))
               for _ in range(200)]
        for _ in range(3):
            llm.step()
        for request_id in ids[::7]:  # some requests are aborted while waiting or running
            llm.abort(request_id)
        while llm.has_unfinished_requests():
            llm.step()
        assert pool.num_free_slots == pool.num_slots
        assert blocks.num_free_blocks == blocks.num_blocks


def test_dense_model_reports_no_state(tmp_path):
    from hf_fixtures import save_hf_model  # noqa: PLC0415

    save_hf_model(tmp_path, "qwen3")
    with LLM(str(tmp_path), device="cpu", kv_cache_memory=1 << 20) as llm:
        report = llm.memory_report()
        assert llm.state_pool is None
    assert report["state_bytes"] == 0 and report["state_slots"] == 0
    assert report["kv_cache_bytes"] <= 1 << 20 and report["prefix_caching"] is True
