"""Mixture-of-experts checkpoints (Qwen3-MoE, Qwen2-MoE, Mixtral) through toolkit vs transformers (fp32),
from per-expert tensors and from transformers' stacked 3-D expert tensors."""
from __future__ import annotations

import pytest
import torch

import toolkit
from moe_fixtures import VOCAB, save_moe_model

CASES = {
    "qwen3_moe-per-expert": dict(kind="qwen3_moe"),
    "qwen3_moe-stacked": dict(kind="qwen3_moe", stacked=True),
    "qwen2_moe-per-expert": dict(kind="qwen2_moe"),
    "qwen2_moe-stacked": dict(kind="qwen2_moe", stacked=True),
    "mixtral-per-expert": dict(kind="mixtral"),
    "mixtral-stacked": dict(kind="mixtral", stacked=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    reference = save_moe_model(path, **CASES[request.param])
    return reference, toolkit.load(path, device="cpu"), path


def test_logits_match_transformers(pair):
    reference, loaded, _ = pair
    ids = torch.randint(0, VOCAB, (23,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    got = loaded.logits(ids)
    assert got.shape == expected.shape == (23, VOCAB)
    assert (got - expected).abs().max().item() <= 1e-4


def test_greedy_generation_matches_transformers(pair):
    reference, loaded, _ = pair
    ids = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(2))
    expected = reference.generate(ids[None], max_new_tokens=10, min_new_tokens=10, do_sample=False,
                                  pad_token_id=0)[0, 9:].tolist()
    assert loaded.generate(ids, max_new_tokens=10, stop_token_ids=[]) == expected


def test_sparse_and_dense_layers_follow_the_config(pair):
    reference, loaded, _ = pair
    layers = loaded.model.model.layers
    kinds = [type(layer.mlp).__name__ for layer in layers]
    expected = [type(layer.mlp).__name__ for layer in reference.model.layers]
    assert [k == "SparseMoEBlock" for k in kinds] == ["Sparse" in k for k in expected]
    sparse = next(layer.mlp for layer in layers if type(layer.mlp).__name__ == "SparseMoEBlock")
    assert tuple(sparse.experts.gate_up_proj.shape) == (4, 64, 64)  # [experts, 2 x 32, hidden]
    assert tuple(sparse.experts.down_proj.shape) == (4, 64, 32)


def test_engine_batched_greedy_equals_one_at_a_time(tmp_path):
    from toolkit import LLM, SamplingParams  # noqa: PLC0415

    save_moe_model(tmp_path, "qwen2_moe", seed=4)
    loaded = toolkit.load(tmp_path, device="cpu")
    generator = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, VOCAB, (n,), generator=generator).tolist() for n in (3, 17, 40, 9, 1)]
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)

    def engine():
        return LLM(loaded, max_num_seqs=8, max_num_batched_tokens=32)  # long prompts prefill in chunks

    batched = [out.token_ids for out in engine().generate(prompts, greedy)]
    alone = [engine().generate(prompt, greedy)[0].token_ids for prompt in prompts]
    assert batched == alone
    assert alone == [loaded.generate(prompt, max_new_tokens=8, stop_token_ids=[]) for prompt in prompts]
