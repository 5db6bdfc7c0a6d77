"""bitsandbytes on the fly (``quant="bnb-nf4"``, ``"bnb-int8"``) for Qwen3.5 / Qwen3-Next.

The Gated DeltaNet projections are ordinary linears: our fused ``[q|k|v|z|b|a]`` projection is
quantized as one tensor, transformers quantizes Qwen3.5's four (or Qwen3-Next's two) separately.
With hidden size 64 every row is exactly one 64-element nf4 block (and int8 scales are per row),
so both sides quantize identical blocks: the oracle is transformers loading the same checkpoint
with the matching BitsAndBytesConfig. Tolerance as in test_bnb_onthefly.py (float ordering only).

The MoE kinds cannot use that oracle: transformers quantizes only ``nn.Linear`` modules, so it
keeps the 3-D experts dense and quantizes the one-output ``shared_expert_gate``, while toolkit
quantizes experts under nf4 and keeps routers dense (docs/moe.md). Their oracle is the one of
test_moe_bnb.py: transformers' forward over weights round-tripped through bitsandbytes' own
``quantize_4bit`` (experts one at a time) and a plain-torch dequantization.
"""
from __future__ import annotations

import pytest
import torch
import re

from hybrid_fixtures import KINDS, MOE_KINDS, prompt, save_hybrid
from test_bnb_fixtures import hf_bnb_model, hf_logits, needs_accelerate, reference_dequantize_4bit

import toolkit

SPECS = {"nf4": "bnb-nf4", "int8": "bnb-int8"}


@needs_accelerate
@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize("family", [kind for kind in KINDS if kind not in MOE_KINDS])
def test_logits_match_transformers_bitsandbytes(family, kind, tmp_path):
    dense = save_hybrid(tmp_path, family, seed=6)
    ids = prompt(20).tolist()
    ours = toolkit.load(tmp_path, quant=SPECS[kind], device="cpu")
    reference = hf_logits(hf_bnb_model(tmp_path, kind), ids)
    got = ours.logits(ids)
    tolerance = 1e-5 * reference.abs().max().item()
    assert (got - reference).abs().max().item() <= tolerance
    assert (reference - hf_logits(dense, ids)).abs().max().item() > 100 * tolerance  # really quantized


# the linears toolkit quantizes (attention, Gated DeltaNet projections, dense and shared-expert MLPs)
_QUANTIZED_LINEAR = re.compile(r"\.(\w+_proj|in_proj_\w+)\.weight$")


def _round_trip(weight: torch.Tensor) -> torch.Tensor:
    from bitsandbytes import functional  # noqa: PLC0415

    packed, state = functional.quantize_4bit(weight.contiguous(), blocksize=64, quant_type="nf4")
    return reference_dequantize_4bit(packed, state)


@pytest.mark.parametrize("family", MOE_KINDS)
def test_moe_nf4_matches_bitsandbytes_round_trip(family, tmp_path):
    pytest.importorskip("bitsandbytes")
    reference = save_hybrid(tmp_path, family, seed=6)
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
                param.copy_(torch.stack([_round_trip(expert) for expert in param]))
            elif _QUANTIZED_LINEAR.search(name) and ".experts." not in name:
                param.copy_(_round_trip(param))
    loaded = toolkit.load(tmp_path, quant="bnb-nf4", device="cpu")
    experts = loaded.model.model.layers[0].mlp.experts
    assert experts.gate_up_proj.numel() == 0 and len(experts.gate_up_proj_4bit) == 4  # dense copy released
    ids = prompt(20)
    with torch.no_grad():
        expected = reference(ids[None]).logits[0]
    assert (loaded.logits(ids) - expected).abs().max().item() <= 1e-4
