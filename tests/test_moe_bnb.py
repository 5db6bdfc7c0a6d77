"""bitsandbytes NF4 on the fly for mixture-of-experts weights (the torch reference path).

Oracle: transformers' forward over weights round-tripped through bitsandbytes' own
``quantize_4bit`` and a plain-torch dequantization of its output (``reference_dequantize_4bit``:
bitsandbytes' AVX-512 CPU ``dequantize_4bit`` mis-scales rows that cut blocks) (experts one at a time, attention and shared-expert
linears as bitsandbytes' Linear4bit would quantize them; routers, norms, embedding and head dense).
"""
from __future__ import annotations

import pytest
import torch

import toolkit
from moe_fixtures import VOCAB, save_moe_model
from test_bnb_fixtures import reference_dequantize_4bit

bnb_functional = pytest.importorskip("bitsandbytes.functional")


def _round_trip(weight: torch.Tensor) -> torch.Tensor:
    packed, state = bnb_functional.quantize_4bit(weight.contiguous(), blocksize=64, quant_type="nf4")
    return reference_dequantize_4bit(packed, state)


def _is_quantized_linear(name: str) -> bool:
    return ("self_attn." in name and name.endswith("_proj.weight")) or ".shared_expert." in name \
        or (".mlp." in name and name.endswith("_proj.weight") and ".experts" not in name)


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe"])
def test_nf4_experts_match_bitsandbytes_round_trip(kind, tmp_path):
    reference = save_moe_model(tmp_path, kind, seed=2)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                param.copy_(torch.stack([_round_trip(expert) for expert in param]))
            elif _is_quantized_linear(name):
                param.copy_(_round_trip(param))
    loaded = toolkit.load(tmp_path, quant="bnb-nf4", device="cpu")
    experts = next(layer.mlp.experts for layer in loaded.model.model.layers if hasattr(layer.mlp, "experts"))
    assert experts.gate_up_proj.numel() == 0 and len(experts.gate_up_proj_4bit) == 4  # dense copy released
    ids = torch.randint(0, VOCAB, (15,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    assert (loaded.logits(ids) - expected).abs().max().item() <= 1e-4
