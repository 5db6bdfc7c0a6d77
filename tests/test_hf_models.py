"""Hugging Face checkpoints through toolkit vs transformers' own forward (fp32)."""
from __future__ import annotations

import pytest
import torch

import toolkit
from hf_fixtures import VOCAB, save_hf_model

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
CASES = {
    "llama-untied-single": dict(kind="llama"),
    "llama-tied-sharded": dict(kind="llama", tied=True, shard_size="60KB"),
    "llama-llama3-rope-mqa": dict(kind="llama", num_kv_heads=1, rope_scaling=LLAMA3_ROPE),
    "llama-linear-rope": dict(kind="llama", rope_scaling={"rope_type": "linear", "factor": 2.0}),
    "qwen2-untied": dict(kind="qwen2"),
    "qwen2-tied-sharded": dict(kind="qwen2", tied=True, shard_size="60KB"),
    "qwen3-untied-sharded": dict(kind="qwen3", shard_size="60KB"),
    "qwen3-tied": dict(kind="qwen3", tied=True),
}


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    reference = save_hf_model(path, **CASES[request.param])
    return reference, toolkit.load(path, device="cpu"), path


def test_sharded_cases_really_are_sharded(pair):
    _, _, path = pair
    if "sharded" in path.name:
        assert (path / "model.safetensors.index.json").exists()
        assert len(list(path.glob("*.safetensors"))) > 1


def test_logits_match_transformers(pair):
    reference, loaded, _ = pair
    ids = torch.randint(0, VOCAB, (17,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    got = loaded.logits(ids)
    assert got.shape == expected.shape == (17, VOCAB)
    assert (got - expected).abs().max().item() <= 1e-4


def test_greedy_generation_matches_transformers(pair):
    reference, loaded, _ = pair
    ids = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(2))
    expected = reference.generate(ids[None], max_new_tokens=12, min_new_tokens=12, do_sample=False,
                                  pad_token_id=0)[0, 9:].tolist()
    assert loaded.generate(ids, max_new_tokens=12, stop_token_ids=[]) == expected


def test_report_describes_the_load(pair):
    reference, loaded, _ = pair
    report = loaded.report
    assert report.format == "safetensors" and report.scheme == "unquantized"
    assert report.tensors_mapped == len(reference.state_dict()) - (1 if reference.config.tie_word_embeddings else 0)
    assert report.bytes_read > 0 and report.gb_per_second > 0
    expected_params = sum(p.numel() for p in reference.parameters())
    padded_rows = loaded.model.model.embed_tokens.rows_per_rank - VOCAB
    extra = padded_rows * 64 * (1 if reference.config.tie_word_embeddings else 2)
    assert report.num_parameters == expected_params + extra


def test_pytorch_bin_checkpoint(tmp_path):
    reference = save_hf_model(tmp_path, kind="llama", safe=False)
    assert list(tmp_path.glob("pytorch_model*.bin"))
    ids = torch.arange(5, 15)
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    assert (toolkit.load(tmp_path, device="cpu").logits(ids) - expected).abs().max() <= 1e-4


@pytest.mark.parametrize("dtype,torch_dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_dtype_flag(tmp_path, dtype, torch_dtype):
    reference = save_hf_model(tmp_path, kind="qwen2")
    loaded = toolkit.load(tmp_path, device="cpu", dtype=dtype)
    assert loaded.model.model.layers[0].mlp.down_proj.weight.dtype == torch_dtype
    ids = torch.arange(3, 13)
    with torch.no_grad():
        expected = reference.to(torch_dtype)(ids[None]).logits[0].float()
    # Both run the same math in 16 bits; differences come from op ordering only.
    assert (loaded.logits(ids) - expected).abs().max() <= 0.05 * expected.abs().max()
