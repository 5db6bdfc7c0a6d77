"""Qwen3.5 / Qwen3-Next at tp=2 (gloo, CPU, spawned workers) equal tp=1.

Each rank holds one of the two linear-attention key heads with its two value heads (and their
conv channels, A_log, dt_bias), so Qwen3-Next's per-key-head interleaved projections and
Qwen3.5's split ones are both cut by heads. The MoE kinds split every expert's intermediate
dimension, or (``expert_parallel=True`` passed to ``toolkit.load``) give each rank two whole experts.
"""
from __future__ import annotations

import pytest
import torch
from hybrid_fixtures import KINDS, MOE_KINDS, prompt, save_hybrid

import toolkit


@pytest.fixture(scope="module", autouse=True)
def only_needed_plugins():
    from toolkit.core.registry import reset_default_registry  # noqa: PLC0415
    from toolkit.kernels import runtime  # noqa: PLC0415

    # the spawned workers see only these plugins: so must this process (no kernels left over from
    # earlier tests, e.g. compiled CPU ops, whose round-off differs from the references')
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TOOLKIT_PLUGINS", "safetensors,unquantized,qwen3-hybrid,reference-kernels,moe-kernels")
        reset_default_registry()
        runtime.reset()
        yield
    reset_default_registry()
    runtime.reset()


def _expert_shapes(loaded):
    experts = loaded.model.model.layers[0].mlp.experts
    return tuple(experts.gate_up_proj.shape), tuple(experts.down_proj.shape)


@pytest.mark.slow  # two spawned workers per case: ~15 s each on 2 cores
@pytest.mark.parametrize("kind, expert_parallel", [(kind, None) for kind in KINDS] + [("qwen3_5_moe", True)])
def test_tp2_matches_tp1(kind, expert_parallel, tmp_path):
    save_hybrid(tmp_path, kind, seed=3)
    ids = prompt(100, seed=4)
    single = toolkit.load(tmp_path, device="cpu")
    expected_logits, expected_tokens = single.logits(ids), single.generate(ids[:11], 8, stop_token_ids=[])
    # float32 round-off grows with the logits' size: sharded sums add in another order. With logits up to 3.6
    # (qwen3_5_moe's random model, CI of 2026-12-06: transformers 5.25) tp=1 itself is 1.3e-5 from a float64 load
    # and tp=2 1.7e-5, so a flat 1e-5 failed; a sharding mistake is off by orders of magnitude more.
    atol = 1e-5 * max(1.0, expected_logits.abs().max().item())
    with toolkit.load(tmp_path, tp=2, device="cpu", expert_parallel=expert_parallel) as handle:
        torch.testing.assert_close(handle.logits(ids), expected_logits, atol=atol, rtol=0)
        assert handle.generate(ids[:11], 8, stop_token_ids=[]) == expected_tokens
        if kind in MOE_KINDS:  # 4 experts of intermediate 32, hidden 64
            per_rank = ((2, 64, 64), (2, 64, 32)) if expert_parallel else ((4, 32, 64), (4, 64, 16))
            assert handle.run_all(_expert_shapes) == [per_rank, per_rank]


@pytest.mark.slow
def test_engine_on_tp2_handle_matches_one_at_a_time(tmp_path):
    """The engine driving a tp=2 handle: both ranks agree on blocks and state slots; greedy tokens of a
    batch with chunked prefill equal tp=1 one-at-a-time generation."""
    from toolkit import LLM, SamplingParams  # noqa: PLC0415

    save_hybrid(tmp_path, "qwen3_5", seed=7)
    prompts = [prompt(n, seed=20 + n).tolist() for n in (4, 45, 1)]
    single = toolkit.load(tmp_path, device="cpu")
    expected = [single.generate(p, 6, stop_token_ids=[]) for p in prompts]
    with toolkit.load(tmp_path, tp=2, device="cpu") as handle:
        with LLM(handle, max_num_seqs=4, max_num_batched_tokens=16, kv_cache_memory=1 << 20, max_model_len=128) as llm:
            report = llm.memory_report()
            outputs = llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
    assert [o.token_ids for o in outputs] == expected
    assert report["state_slots"] == 4 and report["recurrent_layers"] == 3
