"""Qwen3.5 / Qwen3-Next through toolkit vs transformers' own modeling code (fp32).

The 150-token prompt crosses two 64-token chunk boundaries of the chunked gated delta rule.
The transformers reference is re-read from the saved directory, so both sides interpret the
same config.json and weights.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hybrid_fixtures import KINDS, hf_greedy, prompt, save_hybrid
from safetensors.torch import load_file, save_file

import toolkit
from toolkit.core.errors import CheckpointError, MissingMetadataError
from toolkit.plugins.models.qwen3_hybrid import config_from_hf

PROMPT, NEW_TOKENS = 150, 16


@pytest.fixture(scope="module", params=list(KINDS))
def pair(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return save_hybrid(path, request.param), toolkit.load(path, device="cpu"), path


def test_logits_match_transformers(pair):
    hf, ours, _ = pair
    ids = prompt(PROMPT)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    got = ours.logits(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= 1e-4


def test_greedy_matches_transformers(pair):
    hf, ours, _ = pair
    ids = prompt(13, seed=2)
    assert ours.generate(ids, NEW_TOKENS, stop_token_ids=[]) == hf_greedy(hf, ids, NEW_TOKENS)


def test_layer_kinds_come_from_the_checkpoint(pair):
    _, ours, _ = pair
    layers = ours.model.model.layers
    assert [layer.is_linear for layer in layers] == [True, True, False, True]
    assert ours.config.layer_types[2] == "full_attention"


def test_multimodal_wrapper_loads_the_language_model(tmp_path_factory):
    """A Qwen3_5ForConditionalGeneration layout: text weights under model.language_model., vision and
    MTP weights present but skipped; logits equal the plain text model's."""
    src = tmp_path_factory.mktemp("q35-text")
    save_hybrid(src, "qwen3_5")
    dst = tmp_path_factory.mktemp("q35-vl")
    tensors = load_file(src / "model.safetensors")
    renamed = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    renamed["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(renamed, dst / "model.safetensors", metadata={"format": "pt"})
    text = json.loads((src / "config.json").read_text())
    wrapped = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
               "tie_word_embeddings": False, "text_config": {**text, "architectures": None},
               "vision_config": {"depth": 1}}
    (dst / "config.json").write_text(json.dumps(wrapped))
    ids = prompt(40)
    torch.testing.assert_close(toolkit.load(dst, device="cpu").logits(ids), toolkit.load(src, device="cpu").logits(ids),
                               atol=0, rtol=0)


def test_missing_layer_types_is_a_typed_error():
    hf = {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
          "num_hidden_layers": 2, "num_attention_heads": 2}
    with pytest.raises(MissingMetadataError, match="layer_types"):
        config_from_hf("qwen3_5", hf)
    with pytest.raises(CheckpointError, match="layer_types"):
        config_from_hf("qwen3_5", {**hf, "layer_types": ["linear_attention"]})


def test_sparse_moe_qwen3_next_is_refused():
    hf = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2,
          "num_attention_heads": 2, "layer_types": ["linear_attention", "full_attention"], "num_experts": 4}
    with pytest.raises(CheckpointError, match="MoE"):
        config_from_hf("qwen3_next", hf)
