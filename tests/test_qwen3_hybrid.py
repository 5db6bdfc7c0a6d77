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


WRAPPERS = {"qwen3_5": ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
            "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")}


@pytest.mark.parametrize("kind", list(WRAPPERS))
def test_multimodal_wrapper_loads_the_language_model(kind, tmp_path_factory):
    """A Qwen3_5(Moe)ForConditionalGeneration layout: text weights under model.language_model., vision
    and MTP weights present but skipped; logits equal the plain text model's."""
    src = tmp_path_factory.mktemp("q35-text")
    save_hybrid(src, kind)
    dst = tmp_path_factory.mktemp("q35-vl")
    tensors = load_file(src / "model.safetensors")
    renamed = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 3)
    renamed["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(renamed, dst / "model.safetensors", metadata={"format": "pt"})
    text = json.loads((src / "config.json").read_text())
    architecture, model_type = WRAPPERS[kind]
    wrapped = {"architectures": [architecture], "model_type": model_type,
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


@pytest.mark.parametrize("kind, save_options", [
    ("qwen3_next_mixed", {}),  # dense layer 1 among sparse ones, top-k not renormalised
    ("qwen3_next_moe", {"save_original_format": False}),  # transformers' stacked 3-D experts
    ("qwen3_5_moe", {"save_original_format": False}),
])
def test_moe_variants_match_transformers(kind, save_options, tmp_path):
    hf = save_hybrid(tmp_path, kind, **save_options)
    names = load_file(tmp_path / "model.safetensors")
    assert any(n.endswith("mlp.experts.gate_up_proj") for n in names) == bool(save_options)
    ours = toolkit.load(tmp_path, device="cpu")
    if kind == "qwen3_next_mixed":
        assert [type(layer.mlp).__name__ for layer in ours.model.model.layers] == \
            ["SparseMoEBlock", "GatedMLP", "SparseMoEBlock", "SparseMoEBlock"]
        assert ours.config.norm_topk_prob is False
    ids = prompt(90)
    with torch.no_grad():
        expected = hf(ids[None]).logits[0]
    assert (ours.logits(ids) - expected).abs().max().item() <= 1e-4


def test_moe_config_fields():
    hf = {"vocab_size": 10, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 2,
          "num_attention_heads": 2, "layer_types": ["linear_attention", "full_attention"], "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 4, "mlp_only_layers": [0]}
    next_config = config_from_hf("qwen3_next", hf)
    assert [next_config.is_sparse(i) for i in range(2)] == [False, True] and next_config.norm_topk_prob
    moe = config_from_hf("qwen3_5_moe", {**hf, "norm_topk_prob": False, "intermediate_size": None})
    assert [moe.is_sparse(i) for i in range(2)] == [True, True] and moe.norm_topk_prob  # transformers: always
    with pytest.raises(MissingMetadataError, match="moe_intermediate_size"):
        config_from_hf("qwen3_next", {k: v for k, v in hf.items() if k != "moe_intermediate_size"})
    with pytest.raises(MissingMetadataError, match="num_experts"):
        config_from_hf("qwen3_5_moe", {k: v for k, v in hf.items() if k != "num_experts"})


def test_expert_parallel_argument(tmp_path):
    """``toolkit.load(expert_parallel=...)`` sets the MoE config (whole experts per rank at tp > 1; the
    tp=2 result is checked in test_qwen3_hybrid_tp.py) and is refused for a model without experts."""
    from toolkit.core.errors import OptionError  # noqa: PLC0415

    save_hybrid(tmp_path / "moe", "qwen3_5_moe")
    assert toolkit.load(tmp_path / "moe", device="cpu", expert_parallel=True).config.expert_parallel is True
    save_hybrid(tmp_path / "dense", "qwen3_5")
    with pytest.raises(OptionError, match="no experts"):
        toolkit.load(tmp_path / "dense", device="cpu", expert_parallel=True)
